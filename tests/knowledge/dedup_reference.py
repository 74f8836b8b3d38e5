"""One-machine definitions of what deduplication computes through the shuffle: the tests
compare the packed candidate pairs and ``ConnectedComponents`` with them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from transforms.core.vocabulary import DUPLICATE_EXACT, DUPLICATE_NEAR
from transforms.knowledge.dedup.components import Pair
from transforms.knowledge.dedup.minhash import CONTENT, Node


def candidate_pairs(group: tuple[bytes, Iterable[Node]]) -> Iterator[Pair]:
    """Pairs to verify from one LSH bucket: its smallest member with each other member.

    Exact copies share every bucket and are settled by the exact step, so only the first node
    per content hash takes part. A member that is not similar to the smallest one may still meet
    its near copies in another band.
    """
    _, members = group
    first_by_content: dict[bytes, Node] = {}
    for node in sorted(members):
        first_by_content.setdefault(node[CONTENT], node)
    first, *others = sorted(first_by_content.values())
    for other in others:
        yield first, other



def resolve_duplicates(exact: Iterable[Pair],
                       near: Iterable[Pair]) -> dict[Node, tuple[str, Node]]:
    """The nodes to drop, each with its reason and the node that survives, on one machine:
    the definition that ``ConnectedComponents`` computes through the shuffle (tests compare).

    Verified near pairs are joined into clusters (union-find, the smallest node as root); every
    member but the root is a near copy. An exact copy names its group's first node, or the root
    that node's cluster leads to.
    """
    parent: dict[Node, Node] = {}  # non-roots only

    def root(node: Node) -> Node:
        while node in parent:
            node = parent[node]
        return node

    for a, b in near:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    drops = {node: (DUPLICATE_NEAR, root(node)) for node in list(parent)}
    for copy, first in exact:
        drops[copy] = (DUPLICATE_EXACT, root(first))
    return drops
