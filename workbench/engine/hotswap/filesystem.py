"""Which filesystem holds the project, and whether file events can see its saves.

inotify (what watchfiles uses on Linux) reports changes made through this machine's kernel only. On a network or
shared filesystem (NFS, Lustre, GPFS, CIFS, sshfs and other FUSE mounts, a VM's 9p or virtiofs share) a save made on
another machine (a cluster's login node, a laptop's editor over sshfs, the host of a VM) gives no event here: every
save would be silently missed. On those the session polls the files it runs instead (workbench/engine/hotswap/poller.py).
"""

from __future__ import annotations

from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")

# Filesystems whose files other machines write. FUSE mounts (`fuse.sshfs`, `fuse.gcsfuse`, ...) count too: most of
# them pass no remote change to inotify.
SHARED_TYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "9p", "virtiofs",
    "vboxsf", "afs", "panfs", "wekafs", "orangefs", "ocfs2", "gfs2", "fuse",
})


def filesystem_type(path: Path, mountinfo: str | None = None) -> str | None:
    """The type of the filesystem `path` lives on (`ext4`, `nfs4`, `fuse.sshfs`), from the mount table; None where
    it cannot be read (not Linux). `mountinfo`: the table's text, read from /proc when not given."""
    if mountinfo is None:
        try:
            mountinfo = MOUNTINFO.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    target = path.resolve()
    found: tuple[int, str] | None = None
    for line in mountinfo.splitlines():
        mount_point, fstype = _mount(line)
        if mount_point is None or not target.is_relative_to(mount_point):
            continue
        depth = len(Path(mount_point).parts)
        if found is None or depth >= found[0]:  # the deepest mount holds it; of two at one place, the later is on top
            found = (depth, fstype)
    return found[1] if found is not None else None


def is_shared(fstype: str | None) -> bool:
    """True for a filesystem that other machines may write: its saves need polling."""
    return fstype is not None and (fstype in SHARED_TYPES or fstype.startswith("fuse."))


def _mount(line: str) -> tuple[str | None, str]:
    """(mount point, filesystem type) of one mountinfo line: `36 35 98:0 /root /mnt rw,noatime - ext4 /dev/sda rw`."""
    head, separator, tail = line.partition(" - ")
    fields = head.split()
    if not separator or len(fields) < 5 or not tail.split():
        return None, ""
    return _unescape(fields[4]), tail.split()[0]


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
