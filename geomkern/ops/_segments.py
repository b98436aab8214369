"""Grouping ragged segments into size buckets: the batched ops (kpca, kmeans) pad each bucket's
segments to its largest, so the padding ratio bounds the wasted work and memory."""
from __future__ import annotations


def buckets(sizes: list[int], ratio: float = 2.0) -> list[list[int]]:
    """Group segment ids so each padded batch is at most ``ratio`` x its smallest member per side;
    each bucket lists its largest segment first."""
    order = sorted(range(len(sizes)), key=lambda j: -sizes[j])
    out: list[list[int]] = []
    for j in order:
        if out and sizes[out[-1][0]] <= ratio * sizes[j]:
            out[-1].append(j)
        else:
            out.append([j])
    return out
