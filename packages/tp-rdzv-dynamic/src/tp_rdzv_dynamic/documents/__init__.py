"""The run's store keys and documents: layout, codecs, bounded reads, and the board's I/O."""
