"""Loading a user's class named in params.yaml: "package.module:Class", or the name of an entry point
in the group its kind of plugin registers under (environments, feedback sources)."""

from __future__ import annotations

from importlib import import_module


def load_entry(entry: str, where: str, group: str, error: type[Exception]) -> type:
    """The class ``entry`` names; a bad entry raises ``error`` naming ``where`` and what was expected."""
    module_name, sep, class_name = entry.partition(":")
    if not sep:  # not "module:Class": an entry point name
        from importlib.metadata import entry_points

        found = [ep for ep in entry_points(group=group) if ep.name == entry]
        if not found:
            raise error(f"{where}: {entry!r} is neither 'module:Class' nor the name of an "
                        f"entry point in group {group!r}")
        return found[0].load()
    try:
        module = import_module(module_name)
    except ImportError as failure:
        raise error(f"{where}: cannot import module {module_name!r} ({failure})") from None
    try:
        return getattr(module, class_name)
    except AttributeError:
        raise error(f"{where}: module {module_name!r} has no {class_name!r}") from None
