"""What a job process does to itself before any model-written code runs: rlimits, uid, seccomp.

Stdlib only (ctypes for prctl), no side effects at import: worker.py loads this file by path. The
worker calls :func:`probe` once at start to learn which measures this machine allows, and every job
process calls :func:`confine` right after the fork.

The seccomp filter is a hand-assembled classic BPF program (the kernel interface libseccomp wraps):
syscalls on the deny list fail with EPERM, so a program that tries them gets an ordinary OSError and
the grader, not a crash, decides its fate. Only x86_64 syscall numbers are known here; on other
architectures the filter is not installed and the isolation level says so.

Installing a filter costs a job process about 0.25 ms (the kernel checks and JIT-compiles it and
precomputes its verdict for every syscall number), a tenth of a trivial job. So a worker alone in its
pid namespace installs the full filter on itself once (:func:`seal`, exec allowed), and every job
inherits it across the fork; a job that may not exec adds only the two-rule :func:`exec_filter` (0.14 ms).
"""

import ctypes
import errno
import os
import platform
import resource
import struct

JOB_UID = 65534  # "nobody": owns nothing, so a job can neither signal the worker nor read its files

# x86_64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl).
_X86_64 = {
    "socket": 41, "socketpair": 53, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    "mount": 165, "umount2": 166, "unshare": 272, "setns": 308, "bpf": 321, "pivot_root": 155,
    "chroot": 161, "kexec_load": 246, "kexec_file_load": 320, "reboot": 169, "swapon": 167,
    "swapoff": 168, "init_module": 175, "finit_module": 313, "delete_module": 176, "keyctl": 250,
    "add_key": 248, "request_key": 249, "perf_event_open": 298, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_by_handle_at": 304,
    "name_to_handle_at": 303, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "pidfd_send_signal": 424, "pidfd_getfd": 438, "acct": 163,
    "settimeofday": 164, "clock_settime": 227, "sethostname": 170, "setdomainname": 171, "iopl": 172,
    "ioperm": 173, "syslog": 103, "vhangup": 153, "quotactl": 179, "personality": 135,
    "move_pages": 279, "migrate_pages": 256,
    # Checked by argument, not denied outright:
    "clone": 56, "clone3": 435, "execve": 59, "execveat": 322, "ioctl": 16,
    "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
}
_ARGUMENT_CHECKED = {"clone", "clone3", "execve", "execveat", "ioctl", "kill", "tkill", "tgkill",
                     "rt_sigqueueinfo", "rt_tgsigqueueinfo"}
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000
_TIOCSTI = 0x5412  # push bytes into a terminal's input queue: a classic sandbox escape
_NAMESPACE_FLAGS = 0x7E020080  # CLONE_NEW{NS,CGROUP,UTS,IPC,USER,PID,NET,TIME}

# Classic BPF.
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_KILL = 0x7FFF0000, 0x80000000
_RET_EPERM, _RET_ENOSYS = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, _PR_SET_NO_NEW_PRIVS = 22, 2, 38
_PR_SET_CHILD_SUBREAPER = 36


class _Program:
    """A BPF program with forward jumps to named labels, resolved when assembled."""

    def __init__(self):
        self.ops = []  # (code, jt, jf, k) with jt/jf either an int or a label name
        self.labels = {}

    def op(self, code, k=0, jt=0, jf=0):
        self.ops.append((code, jt, jf, k))

    def label(self, name):
        self.labels[name] = len(self.ops)

    def assemble(self):
        out = bytearray()
        for index, (code, jt, jf, k) in enumerate(self.ops):
            jt = self.labels[jt] - index - 1 if isinstance(jt, str) else jt
            jf = self.labels[jf] - index - 1 if isinstance(jf, str) else jf
            out += struct.pack("=HBBI", code, jt, jf, k & 0xFFFFFFFF)
        return bytes(out)


def _arg_low(index):
    return 16 + 8 * index  # offset of the low 32 bits of seccomp_data.args[index] (little endian)


def _syscall_number_program():
    """A program that kills a foreign ABI and loads the syscall number, for the rules that follow."""
    p = _Program()
    p.op(_LD_W_ABS, 4)  # seccomp_data.arch
    p.op(_JEQ, _AUDIT_ARCH_X86_64, jt=1)
    p.op(_RET, _RET_KILL)  # a foreign ABI (i386 int 0x80) would bypass every number below
    p.op(_LD_W_ABS, 0)  # seccomp_data.nr
    return p


def seccomp_filter(worker_pid, allow_exec):
    """The filter for the job processes of worker ``worker_pid``, as assembled BPF bytes.

    Built once per worker, before any fork: it must not depend on the job's own pid.
    """
    p = _syscall_number_program()
    p.op(_JGE, _X32_BIT, jt="eperm")  # the x32 ABI: another way around the numbers
    for name, number in _X86_64.items():
        if name not in _ARGUMENT_CHECKED:
            p.op(_JEQ, number, jt="eperm")
    if not allow_exec:
        p.op(_JEQ, _X86_64["execve"], jt="eperm")
        p.op(_JEQ, _X86_64["execveat"], jt="eperm")
    p.op(_JEQ, _X86_64["clone3"], jt="enosys")  # its flags live in memory BPF cannot read; libc falls back to clone
    p.op(_JEQ, _X86_64["clone"], jt="clone")
    p.op(_JEQ, _X86_64["ioctl"], jt="ioctl")
    for name in ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        p.op(_JEQ, _X86_64[name], jt="signal")
    p.op(_RET, _RET_ALLOW)
    p.label("clone")
    p.op(_LD_W_ABS, _arg_low(0))
    p.op(_JSET, _NAMESPACE_FLAGS, jt="eperm")
    p.op(_RET, _RET_ALLOW)
    p.label("ioctl")
    p.op(_LD_W_ABS, _arg_low(1))
    p.op(_JEQ, _TIOCSTI, jt="eperm")
    p.op(_RET, _RET_ALLOW)
    # Signals only within the job: its own group (0), or processes and groups it made. The kernel
    # hands out pids in increasing order and the worker runs one job at a time, so those are exactly
    # the pids above the worker's (inside bubblewrap's pid namespace nothing else is there at all).
    # As unsigned 32-bit values, -pgid for pgid > worker_pid is below 2**32 - worker_pid; -1
    # ("every process") is above it.
    p.label("signal")
    p.op(_LD_W_ABS, _arg_low(0))
    p.op(_JEQ, 0, jt="allow")
    p.op(_JGE, 0x80000000, jt="negative")
    p.op(_JGE, worker_pid + 1, jt="allow")
    p.op(_RET, _RET_EPERM)
    p.label("negative")
    p.op(_JGE, 2**32 - worker_pid, jt="eperm")
    p.op(_RET, _RET_ALLOW)
    p.label("eperm")
    p.op(_RET, _RET_EPERM)
    p.label("enosys")
    p.op(_RET, _RET_ENOSYS)
    p.label("allow")
    p.op(_RET, _RET_ALLOW)
    return p.assemble()


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


_libc = None


def _libc_handle():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _prctl(*args):
    if _libc_handle().prctl(*args) != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"prctl{args[:1]}: {os.strerror(number)}")


def exec_filter():
    """A filter that only denies execve/execveat: added to a sealed worker's filter for a job that may not exec."""
    p = _syscall_number_program()
    p.op(_JEQ, _X86_64["execve"], jt="eperm")
    p.op(_JEQ, _X86_64["execveat"], jt="eperm")
    p.op(_RET, _RET_ALLOW)
    p.label("eperm")
    p.op(_RET, _RET_EPERM)
    return p.assemble()


_filters = {}  # allow_exec -> assembled filter, built in the worker before any fork
_exec_only = b""  # exec_filter(), built with them
_sealed = False  # whether this process (the worker) already runs under the full filter, exec allowed


def prepare(worker_pid):
    """Load libc and assemble the filters once, in the worker, so each job process only installs them."""
    _libc_handle()
    global _exec_only
    for allow_exec in (False, True):
        _filters[allow_exec] = seccomp_filter(worker_pid, allow_exec)
    _exec_only = exec_filter()


def _install(code):
    program = _SockFprog(len(code) // 8, code)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0)


def install_seccomp(allow_exec):
    _install(_filters.get(allow_exec) or seccomp_filter(os.getppid(), allow_exec))


def seal():
    """Put the worker itself under the job filter (exec allowed), once, so its jobs inherit it.

    Only for a worker alone in its pid namespace (bubblewrap): there every other pid is one of its
    jobs, all above its own, so the filter's signal rule never stops the worker killing a job. The
    filter denies nothing the worker needs (it talks over pipes, forks, signals its jobs, drops uid).
    """
    global _sealed
    _install(_filters[True])
    _sealed = True


def become_subreaper():
    """Orphans of a job re-parent to the worker instead of init, so the worker can find and kill them."""
    try:
        _prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        return True
    except OSError:
        return False


def _set_limit(which, soft):
    _, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)  # an unprivileged process may lower its hard limit but never raise it
    resource.setrlimit(which, (soft, soft))


def set_limits(limits):
    cpu = int(limits["timeout_s"]) + 2  # the wall clock is the real limit; this stops a busy loop the clock missed
    _set_limit(resource.RLIMIT_CPU, cpu)
    _set_limit(resource.RLIMIT_FSIZE, limits["max_output_bytes"])
    _set_limit(resource.RLIMIT_NOFILE, limits["open_files"])
    _set_limit(resource.RLIMIT_CORE, 0)
    _set_limit(resource.RLIMIT_AS, limits["memory_mb"] << 20)
    _set_limit(resource.RLIMIT_NPROC, limits["processes"])


def drop_privileges():
    os.setgroups([])
    os.setresgid(JOB_UID, JOB_UID, JOB_UID)
    os.setresuid(JOB_UID, JOB_UID, JOB_UID)


def confine(measures, limits, allow_exec):
    """Apply, in the job process, the measures the worker probed; raises if one fails."""
    set_limits(limits)
    if "uid" in measures:
        drop_privileges()
    if "seccomp" in measures:
        if not _sealed:
            install_seccomp(allow_exec)
        elif not allow_exec:
            _install(_exec_only or exec_filter())


def probe():
    """The measures this process can apply to its job processes, tried for real in a throwaway fork."""
    candidates = []
    if os.geteuid() == 0:
        candidates.append("uid")
    if platform.machine() == "x86_64" and os.uname().sysname == "Linux":
        candidates.append("seccomp")
    working = []
    for measure in candidates:
        pid = os.fork()
        if pid == 0:
            try:
                if measure == "uid":
                    drop_privileges()
                else:
                    install_seccomp(False)
                    try:
                        import socket

                        socket.socket()
                        os._exit(3)  # the filter did not stop a socket
                    except OSError:
                        pass
                os._exit(0)
            except BaseException:  # noqa: BLE001 - any failure means the measure is unavailable
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) == 0:
            working.append(measure)
    return working
