"""A tiny pytree utility, so that `reverb_tables` needs neither JAX nor dm-tree.

Containers are dicts (any `Mapping`, keys sorted as JAX does), lists, tuples, namedtuples and
`None` (an empty container, as in JAX). Everything else is a leaf. Paths are rendered like
`jax.tree_util.keystr`: `['obs'][0]`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

LEAF = "leaf"


@dataclasses.dataclass(frozen=True)
class TreeDef:
    """The structure of a pytree, without its leaves. Comparable and hashable."""

    kind: str  # "leaf", "dict", "list", "tuple", "namedtuple" or "none"
    meta: Any  # dict keys (tuple), namedtuple class, or None
    children: tuple[TreeDef, ...]

    @property
    def num_leaves(self) -> int:
        if self.kind == LEAF:
            return 1
        return sum(child.num_leaves for child in self.children)


_LEAF_DEF = TreeDef(LEAF, None, ())


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _sorted_keys(mapping: Mapping[Any, Any]) -> tuple[Any, ...]:
    try:
        return tuple(sorted(mapping))
    except TypeError as e:
        raise TypeError(
            f"dict keys of a pytree must be sortable (all str, or all int), got {list(mapping)!r}"
        ) from e


# The recursions below are module functions, not closures: a closure that calls itself is a
# reference cycle, which would keep the leaves (e.g. views of a shared segment) alive until the
# garbage collector runs rather than until the caller drops them.
def _flatten_into(node: Any, path: str, out: list[tuple[str, Any]]) -> TreeDef:
    if node is None:
        return TreeDef("none", None, ())
    if isinstance(node, Mapping):
        keys = _sorted_keys(node)
        children = tuple(_flatten_into(node[k], f"{path}[{k!r}]", out) for k in keys)
        return TreeDef("dict", keys, children)
    if _is_namedtuple(node):
        children = tuple(_flatten_into(v, f"{path}.{name}", out)
                         for name, v in zip(type(node)._fields, node, strict=True))
        return TreeDef("namedtuple", type(node), children)
    if isinstance(node, (list, tuple)):
        children = tuple(_flatten_into(v, f"{path}[{i}]", out) for i, v in enumerate(node))
        return TreeDef("list" if isinstance(node, list) else "tuple", None, children)
    out.append((path or "<root>", node))
    return _LEAF_DEF


def flatten_with_paths(tree: Any) -> tuple[list[tuple[str, Any]], TreeDef]:
    """Flattens `tree` into `[(path, leaf), ...]` (in a deterministic order) and its TreeDef."""
    out: list[tuple[str, Any]] = []
    treedef = _flatten_into(tree, "", out)
    return out, treedef


def flatten(tree: Any) -> tuple[list[Any], TreeDef]:
    """Flattens `tree` into its list of leaves and its TreeDef."""
    pairs, treedef = flatten_with_paths(tree)
    return [leaf for _, leaf in pairs], treedef


def unflatten(treedef: TreeDef, leaves: list[Any]) -> Any:
    """Inverse of `flatten`: rebuilds the tree of `treedef` from `leaves` (in flatten order)."""
    it = iter(leaves)
    result = _build(treedef, it)
    if next(it, _SENTINEL) is not _SENTINEL:
        raise ValueError(f"too many leaves for a tree with {treedef.num_leaves} leaves")
    return result


def _build(d: TreeDef, leaves: Iterator[Any]) -> Any:
    if d.kind == LEAF:
        return next(leaves)
    if d.kind == "none":
        return None
    values = [_build(c, leaves) for c in d.children]
    if d.kind == "dict":
        return dict(zip(d.meta, values, strict=True))
    if d.kind == "namedtuple":
        return d.meta(*values)
    return list(values) if d.kind == "list" else tuple(values)


_SENTINEL = object()


def map_leaves(fn: Callable[[Any], Any], tree: Any) -> Any:
    """Applies `fn` to every leaf of `tree`, keeping its structure."""
    leaves, treedef = flatten(tree)
    return unflatten(treedef, [fn(leaf) for leaf in leaves])
