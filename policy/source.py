"""Safe YAML loading that remembers where every value came from.

PyYAML composes a node graph (safe tags only); we build plain Python values from
it ourselves so that we can refuse duplicate keys (PyYAML silently keeps the
last one, which is how policy edits get lost), bound alias expansion ("billion
laughs") and keep a 1-based line:col for every key and value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from interlock.core.errors import PolicyError, dotted

#: Nodes reached through aliases (beyond their first appearance) allowed per file.
MAX_ALIAS_NODES = 10_000
MAX_DEPTH = 64

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class Mark:
    line: int
    col: int


@dataclass
class SourceDoc:
    """A parsed file: its plain data and the marks of every value and mapping key."""

    name: str
    data: Any
    marks: dict[Path_, Mark] = field(default_factory=dict)
    key_marks: dict[Path_, Mark] = field(default_factory=dict)

    def mark(self, path: Path_, *, key: bool = False) -> Mark:
        """The mark of ``path`` (its key if ``key``), else of its nearest known ancestor."""
        if key and path in self.key_marks:
            return self.key_marks[path]
        for end in range(len(path), -1, -1):
            if path[:end] in self.marks:
                return self.marks[path[:end]]
        return Mark(1, 1)

    def error(self, path: Path_, message: str, *, key: bool = False) -> PolicyError:
        m = self.mark(path, key=key)
        return PolicyError(
            message, file=self.name, line=m.line, col=m.col, path=dotted(path) or None
        )


def parse_yaml(text: bytes, name: str, *, max_alias_nodes: int = MAX_ALIAS_NODES) -> SourceDoc:
    """Parse one YAML document safely into a :class:`SourceDoc`."""
    import yaml

    from interlock.core.files import FileProblem, decode_utf8

    # Decoded and checked here, so that encoding errors say line:col and what is wrong
    # (PyYAML reports a byte offset, sometimes of the wrong character).
    try:
        source = decode_utf8(text, name)
    except FileProblem as exc:
        raise PolicyError(exc.detail, file=name, line=exc.line, col=exc.col) from None
    bad = _CONTROL.search(source)
    if bad is not None:
        line = source.count("\n", 0, bad.start()) + 1
        col = bad.start() - (source.rfind("\n", 0, bad.start()) + 1) + 1
        raise PolicyError(
            f"control character {bad.group()!r} is not allowed in a policy file",
            file=name, line=line, col=col,
        )
    loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader = loader_cls(source)
    try:
        root = loader.get_single_node()
        if root is None:
            raise PolicyError("empty policy file", file=name, line=1, col=1)
        doc = SourceDoc(name, None)
        doc.data = _Builder(loader, doc, max_alias_nodes).build(root, ())
        return doc
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = " ".join(p for p in (exc.context, exc.problem) if p) or str(exc)
        at_line = mark.line + 1 if mark else None
        at_col = mark.column + 1 if mark else None
        raise PolicyError(
            f"invalid YAML: {message}{_explain(source, at_line, at_col)}",
            file=name, line=at_line, col=at_col,
        ) from None
    except yaml.YAMLError as exc:
        raise PolicyError(f"invalid YAML: {exc}", file=name) from None
    finally:
        loader.dispose()


# C0 controls but tab, newline and carriage return; DEL. (YAML refuses them anyway, with
# a byte position.)
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
#: PyYAML's limit on an implicit (unquoted or quoted single-line) key.
_MAX_KEY = 1024


def _explain(source: str, line: int | None, col: int | None) -> str:
    """What PyYAML's message means, for the two that puzzle people: a tab, a long key."""
    if line is None:
        return ""
    lines = source.splitlines()
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    if "\t" in text[: (col or 0) + 1].lstrip(" ") or text.startswith("\t"):
        return " (a tab: YAML indents with spaces only)"
    if len(text) > _MAX_KEY and ":" in text[_MAX_KEY:]:
        return f" (a key longer than {_MAX_KEY} characters: YAML does not allow one)"
    return ""


class _Builder:
    def __init__(self, loader: Any, doc: SourceDoc, max_alias_nodes: int) -> None:
        self.loader = loader
        self.doc = doc
        self.alias_budget = max_alias_nodes
        self.max_alias_nodes = max_alias_nodes
        self.seen: set[int] = set()
        self.ancestors: set[int] = set()

    def _fail(self, node: Any, path: Path_, message: str) -> PolicyError:
        m = node.start_mark
        return PolicyError(
            message,
            file=self.doc.name,
            line=m.line + 1,
            col=m.column + 1,
            path=dotted(path) or None,
        )

    def build(self, node: Any, path: Path_, aliased: bool = False) -> Any:
        import yaml

        if id(node) in self.ancestors:
            raise self._fail(node, path, "recursive alias")
        if len(path) > MAX_DEPTH:
            raise self._fail(node, path, f"nesting deeper than {MAX_DEPTH} levels")
        aliased = aliased or id(node) in self.seen
        self.seen.add(id(node))
        if aliased:
            self.alias_budget -= 1
            if self.alias_budget < 0:
                raise self._fail(
                    node,
                    path,
                    f"alias expansion exceeds {self.max_alias_nodes} nodes "
                    "(refused as a possible billion-laughs document)",
                )
        if path not in self.doc.marks:
            m = node.start_mark
            self.doc.marks[path] = Mark(m.line + 1, m.column + 1)
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, path)
        if node.tag not in (_MAP_TAG, _SEQ_TAG):
            raise self._fail(node, path, f"YAML tag {node.tag!r} is not allowed in a policy file")
        self.ancestors.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return [self.build(item, (*path, i), aliased) for i, item in enumerate(node.value)]
            return self._mapping(node, path, aliased)
        finally:
            self.ancestors.discard(id(node))

    def _scalar(self, node: Any, path: Path_) -> Any:
        try:
            value = self.loader.construct_object(node, deep=True)
        except ValueError as exc:  # e.g. an integer past Python's 4300-digit limit
            shown = node.value if len(node.value) <= 40 else f"{node.value[:40]}…"
            why = str(exc).split(";")[0]
            raise self._fail(
                node, path, f"cannot read value {shown!r} ({len(node.value)} characters): {why}"
            ) from None
        if isinstance(value, float) and value != value:
            raise self._fail(node, path, "NaN is not allowed in a policy (it equals nothing)")
        return value

    def _mapping(self, node: Any, path: Path_, aliased: bool) -> dict[Any, Any]:
        import yaml

        out: dict[Any, Any] = {}
        merged: list[Any] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                sources = (
                    value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                )
                for src in sources:
                    if not (isinstance(src, yaml.MappingNode) and src.tag == _MAP_TAG):
                        raise self._fail(
                            src, path, "a merge key (<<) needs a mapping or a list of them"
                        )
                merged.extend(sources)
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise self._fail(key_node, path, "mapping keys must be plain scalars")
            key = self._scalar(key_node, path)
            if key in out:
                key_path = (*path, key)
                first = self.doc.key_marks[key_path]
                raise self._fail(
                    key_node,
                    (*path, key),
                    f"duplicate key {key!r} (first defined at line {first.line})",
                )
            km = key_node.start_mark
            self.doc.key_marks.setdefault((*path, key), Mark(km.line + 1, km.column + 1))
            out[key] = self.build(value_node, (*path, key), aliased)
        # Explicit keys win over merged ones; earlier merge sources win over later ones.
        for src in merged:
            for key, value in self.build(src, path, True).items():
                out.setdefault(key, value)
        return out
