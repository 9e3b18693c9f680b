"""The shared-memory wire: ranks of one host exchange bytes through a segment they all map.

- segment.py  named /dev/shm segments: create, attach, unlinked once all have mapped them
- sync.py     per-rank words, bells and waits: a short spin, then a futex, bounded
- channel.py  point-to-point: one slotted channel per ordered pair, a progress engine
- wire.py     ShmWire (a Wire like TorchWire), and the torch wire that pumps it
- board.py    the load/store algorithms' side: staging, descriptors, rounds, syncs
- alloc.py    shared allocations (dt.shm_empty): tensors peers read in place
- host.py     one group's segment on one host: its layout, what a rank holds of it (HostLink)
- attach.py   how the host's ranks come to share it, and the engine, wire and board built on it

dt.transport.connect builds all of it for a group at its first collective.
"""
