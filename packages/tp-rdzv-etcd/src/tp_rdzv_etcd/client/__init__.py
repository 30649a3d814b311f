"""How we talk to etcd: its v3 messages, and the transports that carry them.

``messages`` reads and writes etcd's protocol buffers; ``rpc`` sends them over
gRPC, ``watch_stream`` and ``lease_stream`` share one stream per process for
watches and keep-alives, ``shared`` the reads, waits and mirrors of a
process's threads (``per_process`` keeps what a process shares); ``gateway``
sends the same requests as JSON to etcd's gateway (``/v3/...``);
``transport`` picks between them (``transport=auto``).
Every one fails over between the members of the cluster (``failover``).
"""
