"""The optional mypyc build: ``TP_STORE_COMPILE=1`` compiles the wheel's hot modules.

Without it the wheel is pure Python and this hook does nothing. With it, the
modules listed as ``compile`` in pyproject.toml are compiled by mypyc into
extension modules that the wheel carries beside every ``.py`` file (an
extension module is imported before the source of the same name), so it is
the same package, faster, and tagged for this interpreter and platform. The
compiler (mypy and setuptools) is a build dependency of that build only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SWITCH = "TP_STORE_COMPILE"
COMPILER = ["mypy>=2.4", "setuptools>=70"]
# mypy's settings for compiling: none of the repository's, no cache in the tree.
MYPY_CONFIG = "[mypy]\nignore_missing_imports = True\n"


class MypycBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    """Compiles ``compile`` (paths relative to pyproject.toml) when ``$TP_STORE_COMPILE`` is 1."""

    _scratch: Path | None = None  # the compiler's output, until the wheel holds it

    def _wanted(self) -> bool:
        switch = os.environ.get(SWITCH, "")
        if switch not in ("", "0", "1"):
            raise ValueError(f"{SWITCH} must be 0 or 1, got {switch!r}")
        return self.target_name == "wheel" and switch == "1"

    def dependencies(self) -> list[str]:
        return COMPILER if self._wanted() else []

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if not self._wanted():
            return
        if version == "editable":
            raise ValueError(f"{SWITCH}=1 builds a wheel, not an editable install")
        # The compiler is only there when it is wanted.
        from mypyc.build import mypycify  # noqa: PLC0415
        from setuptools import Distribution  # noqa: PLC0415

        root = Path(self.root)
        sources = [str(root / path) for path in self.config["compile"]]
        self._scratch = scratch = Path(tempfile.mkdtemp(prefix="tp-store-mypyc-"))
        config = scratch / "mypy.ini"
        config.write_text(MYPY_CONFIG)
        options = ["--config-file", str(config), "--cache-dir", str(scratch / "cache")]
        extensions = mypycify(
            [*options, *sources],
            target_dir=str(scratch / "c"),
            group_name="tp_store",  # its shared library is tp_store__mypyc
        )
        built = scratch / "lib"
        distribution = Distribution({"ext_modules": extensions})
        build_ext = distribution.get_command_obj("build_ext")
        build_ext.build_lib = str(built)
        build_ext.build_temp = str(scratch / "temp")
        distribution.run_command("build_ext")

        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        for library in sorted(built.rglob("*.so")) + sorted(built.rglob("*.pyd")):
            build_data["force_include"][str(library)] = library.relative_to(built).as_posix()

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
