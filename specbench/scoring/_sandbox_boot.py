"""Bootstrap of one sandboxed program run (see ``sandbox.py``); started as ``python -I -S THIS SPEC.json``.

Trusted code, standard library only, single-threaded. It sets up the jail, then execs a fresh Python
interpreter on the generated program, so no generated code ever runs in a process that holds privileges:

- ``namespaces`` (root with CAP_SYS_ADMIN): new mount, network, PID, IPC and UTS namespaces. Every mount
  is remounted read-only except the program's work dir; directories the sandbox user cannot traverse
  (e.g. ``/root`` holding the interpreter) are hidden behind an empty tmpfs into which only the
  interpreter's directories are bind-mounted back. The network namespace has only a loopback device
  that is down. The program is PID 1 of its PID namespace (the kernel kills every process left in it
  when it exits) and gets SIGKILL when this bootstrap dies (PR_SET_PDEATHSIG).
- every mode: resource limits (address space, CPU seconds, processes, file size, open files, no core
  dumps) and, when started as root, a fresh unprivileged uid/gid with no supplementary groups.
- ``preamble``: the program runs behind an audit-hook guard (``PREAMBLE``) that refuses sockets,
  process creation, ctypes and writes outside the work dir; a guard inside the interpreter, not a kernel
  boundary.

Exit status: the program's, 128 + N when signal N killed it, 125 when the jail could not be built.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import stat
import sys

SETUP_FAILED = 125

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 1 << 18, 1 << 21, 1 << 24
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
_KEPT_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}

# Runs before the program in ``preamble`` mode (python -I -c PREAMBLE program.py).
PREAMBLE = r"""
import os, sys
def _install_guard():
    try:
        import ctypes  # imported before the guard (numpy needs it); loading libraries stays refused
    except ImportError:
        pass
    root = os.path.realpath(os.getcwd())
    realpath, fspath, sep = os.path.realpath, os.fspath, os.sep
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    refused = frozenset((
        "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
        "socket.getaddrinfo", "socket.gethostbyname", "os.fork", "os.forkpty", "os.system", "os.exec",
        "os.posix_spawn", "os.spawn", "subprocess.Popen", "os.kill", "os.killpg", "ctypes.dlopen",
        "ctypes.dlsym", "ctypes.cdata", "ctypes.addressof", "os.setuid", "sys.remote_exec",
    ))
    refused_imports = frozenset(("_posixsubprocess", "_multiprocessing"))
    path_events = frozenset((
        "os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod", "os.chown", "os.symlink",
        "os.link", "os.truncate", "os.utime", "shutil.rmtree", "os.mknod", "os.mkfifo",
    ))

    def inside(path):
        if isinstance(path, int):
            return True
        try:
            resolved = realpath(fspath(path))
        except (TypeError, ValueError):
            return False
        return resolved == root or resolved.startswith(root + sep)

    def hook(event, args):
        if event in refused:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args[0] in refused_imports:
            raise PermissionError(f"sandbox: import of {args[0]} is not allowed")
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags
            )
            if writes and path is not None and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} outside the work dir is not allowed")
        elif event in path_events:
            for arg in args[:2]:
                if isinstance(arg, (str, bytes, os.PathLike)) and not inside(arg):
                    raise PermissionError(f"sandbox: {event} on {arg!r} outside the work dir is not allowed")

    sys.addaudithook(hook)

_install_guard()
del _install_guard
_program = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path[0:0] = [os.getcwd()]
import runpy
del os, sys
runpy.run_path(_program, run_name="__main__")
"""


def _fail(message: str) -> None:
    sys.stderr.write(f"sandbox setup failed: {message}\n")
    sys.stderr.flush()
    os._exit(SETUP_FAILED)


def _libc():
    import ctypes  # trusted bootstrap code; the program never gets this process

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    libc.unshare.argtypes = [ctypes.c_int]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return libc, ctypes


def _call(ctypes, result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(libc, ctypes, source, target, fstype, flags, data=None) -> None:
    encode = lambda s: None if s is None else os.fsencode(s)
    _call(
        ctypes,
        libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)),
        f"mount {target}",
    )


def _unescape(field: str) -> str:
    """Mount points in /proc/self/mountinfo escape space, tab, newline and backslash as \\ooo."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and len(field[i + 1 : i + 4]) == 3 and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mounts() -> list[tuple[str, set[str]]]:
    """(mount point, per-mount options) of the visible mounts: the last one mounted on each point."""
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        rows = [line.split() for line in handle]
    visible = {_unescape(row[4]): set(row[5].split(",")) for row in rows}
    return list(visible.items())


def _blocked_ancestor(path: str) -> str | None:
    """The first directory on the way to ``path`` that others cannot traverse (no o+x), if any."""
    current = "/"
    for part in [p for p in path.split("/") if p]:
        if not os.stat(current).st_mode & stat.S_IXOTH:
            return current
        current = os.path.join(current, part)
    if os.path.isdir(current) and not os.stat(current).st_mode & stat.S_IXOTH:
        return current
    return None


def _expose(libc, ctypes, paths: list[str], staging: str) -> None:
    """Make ``paths`` reachable for the sandbox user behind the directories that hide them.

    Each hiding directory gets an empty tmpfs on top; only ``paths`` are bind-mounted back into it.
    """
    paths = sorted({os.path.realpath(p) for p in paths})
    paths = [p for p in paths if not any(p != q and p.startswith(q + "/") for q in paths)]
    groups: dict[str, list[str]] = {}
    for path in paths:
        ancestor = _blocked_ancestor(path)
        if ancestor is not None and ancestor != path:
            groups.setdefault(ancestor, []).append(path)
    for number, (ancestor, inner) in enumerate(sorted(groups.items())):
        stages = []
        for index, path in enumerate(inner):
            stage = os.path.join(staging, f"{number}-{index}")
            os.mkdir(stage, 0o700)
            _mount(libc, ctypes, path, stage, None, MS_BIND | MS_REC)
            stages.append((stage, path))
        _mount(libc, ctypes, "tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
        for stage, path in stages:
            os.makedirs(path, 0o755, exist_ok=True)
            _mount(libc, ctypes, stage, path, None, MS_BIND | MS_REC)
            _call(ctypes, libc.umount2(os.fsencode(stage), MNT_DETACH), f"umount {stage}")


def _jail(spec: dict) -> None:
    """New namespaces; everything read-only except the work dir. Runs as root, before the fork."""
    libc, ctypes = _libc()
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    _call(ctypes, libc.unshare(flags), "unshare")
    # Nothing done in this mount namespace may propagate back to the host.
    _mount(libc, ctypes, None, "/", None, MS_REC | MS_PRIVATE)
    workdir = spec["workdir"]
    _mount(libc, ctypes, workdir, workdir, None, MS_BIND)
    _expose(libc, ctypes, spec["expose"], spec["staging"])
    for target, options in _mounts():
        if target == workdir or "ro" in options or not os.path.exists(target):
            continue
        kept = sum(flag for name, flag in _KEPT_FLAGS.items() if name in options)
        _mount(libc, ctypes, None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)
    writable = [t for t, o in _mounts() if "rw" in o and t != workdir]
    if writable:
        raise OSError(f"mounts still writable: {writable}")


def _limit(spec: dict) -> None:
    limits = spec["limits"]
    for name, value in (
        ("RLIMIT_AS", limits["memory_bytes"]),
        ("RLIMIT_FSIZE", limits["file_bytes"]),
        ("RLIMIT_NOFILE", limits["open_files"]),
        ("RLIMIT_NPROC", limits["processes"]),
        ("RLIMIT_CORE", 0),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))
    cpu = limits["cpu_seconds"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))


def _drop_privileges(spec: dict) -> None:
    uid = spec.get("uid")
    if uid is None:
        return
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError("could not drop privileges")


def _exec_program(spec: dict) -> None:
    """Child side: limits, new /proc (namespaces), drop privileges, exec the interpreter."""
    try:
        if spec["isolation"] == "namespaces":
            libc, ctypes = _libc()
            _mount(libc, ctypes, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
        _limit(spec)
        _drop_privileges(spec)
        if spec["isolation"] == "namespaces":
            _call(ctypes, libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
        os.chdir(spec["workdir"])
        os.umask(0o077)
        python, program = spec["python"], spec["program"]
        if spec["isolation"] == "preamble":
            argv = [python, "-I", "-c", PREAMBLE, program]
        else:
            argv = [python, "-I", program]
        os.execve(python, argv, spec["env"])
    except BaseException as err:  # noqa: BLE001 (report any failure and never fall through)
        _fail(f"{type(err).__name__}: {err}")


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as handle:
        spec = json.load(handle)
    if spec["isolation"] == "namespaces":
        try:
            _jail(spec)
        except BaseException as err:  # noqa: BLE001
            _fail(f"{type(err).__name__}: {err}")
    pid = os.fork()
    if pid == 0:
        _exec_program(spec)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(128 - code if code < 0 else code)


if __name__ == "__main__":
    main()
