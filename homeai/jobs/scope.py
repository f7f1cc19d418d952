"""Which files an index run may read: those whose real path lies in a configured folder.

Every member can search what is indexed, so a file symlink in an indexed folder must not
carry a file from elsewhere into the index (`ln -s /etc/passwd notes.txt`). The configured
paths are resolved once, when a run starts: a configured folder that is itself a link (or
lies under one) is fine, and so is a link to a file in another configured folder. A file
named directly in the config is admitted at its own place only: its folder is resolved,
the name itself is not followed, so swapping it for a link gains nothing. `extract.read_file`
checks each file before it opens it, and again after (the file opened is the file checked).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

OUTSIDE = "not indexed: a link to a file outside the indexed folders"


def root_path(configured: str) -> Path:
    """A configured or named path as the run sees it: `~` expanded, absolute, links kept."""
    return Path(os.path.abspath(os.path.expanduser(configured)))


@dataclass(frozen=True)
class Scope:
    folders: tuple[str, ...]  # real paths of the configured folders
    files: frozenset[str]  # files named directly: their folder's real path joined with their own name

    @classmethod
    def of(cls, roots: Iterable[Path]) -> Scope:
        folders, files = [], set()
        for root in roots:
            if root.is_dir():
                folders.append(os.path.realpath(root))
            else:
                files.add(os.path.join(os.path.realpath(root.parent), root.name))
        return cls(tuple(folders), frozenset(files))

    def admits(self, real_path: str) -> bool:
        """Whether a file whose symlinks are all resolved (`os.path.realpath`) may be indexed."""
        if real_path in self.files:
            return True
        return any(real_path.startswith(folder.rstrip(os.sep) + os.sep) for folder in self.folders)
