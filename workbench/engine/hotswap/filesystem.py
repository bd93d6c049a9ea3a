"""Which filesystem holds the project, and whether file events can see its saves.

inotify (what watchfiles uses on Linux) reports changes made through this machine's kernel only. On a network or
shared filesystem (NFS, Lustre, GPFS, CIFS, sshfs and other FUSE mounts, a VM's 9p or virtiofs share) a save made on
another machine (a cluster's login node, a laptop's editor over sshfs, the host of a VM) gives no event here: every
save would be silently missed. On those the session polls the files it runs instead
(workbench/engine/hotswap/poller.py).
"""

from __future__ import annotations

import os
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")

# Filesystems whose files other machines write. FUSE mounts (`fuse.sshfs`, `fuse.gcsfuse`, ...) count too: most of
# them pass no remote change to inotify.
SHARED_TYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "9p", "virtiofs",
    "vboxsf", "afs", "panfs", "wekafs", "orangefs", "ocfs2", "gfs2", "fuse", "drvfs", "vmhgfs",
})
LOCAL_FUSE_TYPES = frozenset({"fuse.fuse-overlayfs"})  # a rootless container's root: this machine's own disk


def filesystem_type(path: Path, mountinfo: str | None = None, device: str | None = None) -> str | None:
    """The type of the filesystem `path` lives on (`ext4`, `nfs4`, `fuse.sshfs`), from the mount table; None where
    it cannot be read (not Linux). `mountinfo`: the table's text, and `device`: the path's `major:minor`, both read
    from this machine when the table is not given."""
    target = path.resolve()
    if mountinfo is None:
        try:
            mountinfo = MOUNTINFO.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        device = _device(target)
    mounts = [mount for mount in map(_mount, mountinfo.splitlines()) if mount is not None]
    # The mounts of the path's own device, where it can be read: a mount hidden by a later one over its parent, or a
    # bind mount, is then not taken for the path's.
    mine = [mount for mount in mounts if mount[0] == device] if device is not None else []
    found: tuple[int, str] | None = None
    for _, mount_point, fstype in mine or mounts:
        if not target.is_relative_to(mount_point):
            continue
        depth = len(Path(mount_point).parts)
        if found is None or depth >= found[0]:  # the deepest mount holds it; of two at one place, the later is on top
            found = (depth, fstype)
    return found[1] if found is not None else None


def is_shared(fstype: str | None) -> bool:
    """True for a filesystem that other machines may write: its saves need polling."""
    if fstype is None or fstype in LOCAL_FUSE_TYPES:
        return False
    return fstype in SHARED_TYPES or fstype.startswith("fuse.")


def _device(path: Path) -> str | None:
    """`major:minor` of the device `path` (or its nearest existing parent) is on, as the mount table writes it."""
    for candidate in (path, *path.parents):
        try:
            number = os.stat(candidate).st_dev
        except OSError:
            continue
        return f"{os.major(number)}:{os.minor(number)}"
    return None


def _mount(line: str) -> tuple[str, str, str] | None:
    """(device, mount point, filesystem type) of one mountinfo line: `36 35 98:0 /root /mnt rw - ext4 /dev/sda rw`."""
    head, separator, tail = line.partition(" - ")
    fields = head.split()
    if not separator or len(fields) < 5 or not tail.split():
        return None
    return fields[2], _unescape(fields[4]), tail.split()[0]


def _unescape(text: str) -> str:
    """Mount points escape space, tab, newline and backslash as octal (`\\040`)."""
    if "\\" not in text:
        return text
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 3 < len(text) and text[i + 1 : i + 4].isdigit():
            out.append(chr(int(text[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)
