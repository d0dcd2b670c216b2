"""Where in a resource file an error is: the line of a resource entry or field.

:func:`field_path` reads the field path out of a ``google.protobuf.json_format``
parse error (``Failed to parse endpoints field: ... has no field named "x"``);
:func:`locate` finds the line of ``resources[i]`` and, below it, the deepest
key of that path in the YAML/JSON text (JSON is read as YAML, which keeps
line marks). Both are best effort: an error is still reported without them.
:class:`Lines` finds the line of an exact field path (list indices included)
for ``pyxds serve``'s warnings, composing the text once.
"""

from __future__ import annotations

import re
from typing import Any

_FAILED = re.compile(r"Failed to parse (\w+) field: ")
_NO_FIELD = re.compile(r'has no field named "(\w+)"')
_ENUM_AT = re.compile(r"Invalid enum value .* at [\w.]*?\.(\w+)$")


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def field_path(message: str) -> tuple[list[str], str]:
    """``(path, reason)`` of a json_format ParseError message.

    ``path`` lists the field names from the resource down to the bad one;
    ``reason`` is the message without the ``Failed to parse X field:``
    prefixes and without protobuf's list of available fields.
    """
    path = _FAILED.findall(message)
    reason = _FAILED.sub("", message).split("\n", 1)[0].rstrip(".")
    last = _NO_FIELD.search(reason) or _ENUM_AT.search(reason)
    if last is not None:
        path.append(last.group(1))
    return path, reason


def _key_matches(node: Any, name: str) -> bool:
    value = getattr(node, "value", None)
    return isinstance(value, str) and _snake(value) == _snake(name)


def _find(node: Any, path: list[str]) -> Any:
    """The key node deepest along ``path`` (in a sequence: the first item with the key)."""
    import yaml

    if not path:
        return None
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if _key_matches(key, path[0]):
                return _find(value, path[1:]) or key
        # protobuf's message can skip a level (a oneof or a nested message): look deeper.
        for _, value in node.value:
            found = _find(value, path)
            if found is not None:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            found = _find(item, path)
            if found is not None:
                return found
    return None


def locate(text: str, index: int | None, path: list[str] | None = None) -> int | None:
    """1-based line of ``resources[index]`` (and of ``path`` inside it), or None."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    if isinstance(root, yaml.MappingNode):
        root = next((v for k, v in root.value if getattr(k, "value", None) == "resources"), None)
    if index is None or not isinstance(root, yaml.SequenceNode) or index >= len(root.value):
        return None
    entry = root.value[index]
    found = _find(entry, list(path or ()))
    line: int = (found or entry).start_mark.line
    return line + 1


class Lines:
    """Lines of one resource file's entries and fields (composed once)."""

    def __init__(self, text: str) -> None:
        import yaml

        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError:
            root = None
        if isinstance(root, yaml.MappingNode):
            root = next(
                (v for k, v in root.value if getattr(k, "value", None) == "resources"), None
            )
        self._entries: list[Any] = list(root.value) if isinstance(root, yaml.SequenceNode) else []

    def of(self, index: int, path: tuple[str | int, ...] = ()) -> int | None:
        """1-based line of ``resources[index]`` and then of the deepest part of
        ``path`` (field names in either spelling, list indices) found in it."""
        import yaml

        if not 0 <= index < len(self._entries):
            return None
        node = self._entries[index]
        line = int(node.start_mark.line) + 1
        for part in path:
            if isinstance(part, int):
                if not isinstance(node, yaml.SequenceNode) or part >= len(node.value):
                    break
                node = node.value[part]
                line = int(node.start_mark.line) + 1
                continue
            if not isinstance(node, yaml.MappingNode):
                break
            found = next(((k, v) for k, v in node.value if _key_matches(k, part)), None)
            if found is None:
                break
            line = int(found[0].start_mark.line) + 1
            node = found[1]
        return line
