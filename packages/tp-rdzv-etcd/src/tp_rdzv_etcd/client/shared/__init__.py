"""What the threads of a process share on one cluster, so that nodes in one process cost
etcd about what one node does: ``reads`` sends the single-key reads that come at once in
one transaction, ``waits`` gives the waiters for one key one read and one watch, and
``mirrors`` keeps a small family of keys written once (a run's round outcomes) by one
watch, so that waits for them cost no request at all.
"""
