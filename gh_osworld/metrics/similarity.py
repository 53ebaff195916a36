"""Text similarity as OSWorld's metrics score it (rapidfuzz's `fuzz.ratio`, which the guest has no package
for): 100 * 2 * LCS(a, b) / (len(a) + len(b)), the indel similarity; 100 for two empty texts."""

from __future__ import annotations


def lcs_length(a: str, b: str) -> int:
    """The longest common subsequence's length, bit-parallel (Hyyrö 2004): one big-int step per character
    of the longer text, so whole documents compare in well under a second."""
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return 0
    masks: dict[str, int] = {}
    for i, ch in enumerate(b):
        masks[ch] = masks.get(ch, 0) | (1 << i)
    full = (1 << len(b)) - 1
    v = full
    for ch in a:
        u = v & masks.get(ch, 0)
        v = ((v + u) | (v - u)) & full
    return len(b) - bin(v).count("1")


def ratio(a: str, b: str) -> float:
    if not a and not b:
        return 100.0
    return 100.0 * 2 * lcs_length(a, b) / (len(a) + len(b))
