"""Batch verification: many graphs, sharded the way a Kubernetes Indexed Job shards work.

Kubernetes is the distributed engine (placement, retries, parallelism); this
package only makes one shard deterministic (manifest.py: which graphs are
mine), idempotent and atomic (store.py: one file per finished graph, written
by rename, skipped when present), and merges the shards' files into one
report (merge.py), comparing nodes bit for bit when the run was a per-node
screen (screen.py).
"""
