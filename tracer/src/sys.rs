//! The C library, declared by hand so the crate builds with a bare `rustc` and no
//! dependencies: the functions, constants and types the tracer calls.

use super::*;

// ---- libc, declared by hand so the crate builds with a bare `rustc` and no dependencies ----

#[repr(C)]
pub(crate) struct Timespec {
    pub(crate) tv_sec: i64,
    pub(crate) tv_nsec: i64,
}

#[repr(C)]
pub(crate) struct IoVec {
    pub(crate) base: *const c_void,
    pub(crate) len: usize,
}

/// `Dl_info`, what `dladdr` says of an address.
#[repr(C)]
pub(crate) struct DlInfo {
    pub(crate) fname: *const c_char,
    pub(crate) fbase: *mut c_void,
    pub(crate) sname: *const c_char,
    pub(crate) saddr: *mut c_void,
}

impl DlInfo {
    pub(crate) const fn empty() -> Self {
        Self {
            fname: ptr::null(),
            fbase: null_mut(),
            sname: ptr::null(),
            saddr: null_mut(),
        }
    }
}

/// `sigset_t` (1024 bits in glibc).
pub(crate) type SigSet = [u64; 16];
/// `pthread_attr_t` (56 bytes on x86-64, 64 on aarch64).
pub(crate) type PthreadAttr = [u64; 8];

unsafe extern "C" {
    pub(crate) fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    pub(crate) fn dladdr(addr: *const c_void, info: *mut DlInfo) -> c_int;
    /// With `RTLD_DL_SYMENT`, `extra` receives the symbol's `Elf64_Sym`.
    pub(crate) fn dladdr1(
        addr: *const c_void,
        info: *mut DlInfo,
        extra: *mut *mut c_void,
        flags: c_int,
    ) -> c_int;
    pub(crate) fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void;
    pub(crate) fn dlerror() -> *const c_char;
    pub(crate) fn getenv(name: *const c_char) -> *const c_char;
    pub(crate) fn open(path: *const c_char, flags: c_int, ...) -> c_int;
    pub(crate) fn read(fd: c_int, buf: *mut c_void, n: usize) -> isize;
    pub(crate) fn writev(fd: c_int, iov: *const IoVec, count: c_int) -> isize;
    pub(crate) fn write(fd: c_int, buf: *const c_void, n: usize) -> isize;
    pub(crate) fn close(fd: c_int) -> c_int;
    pub(crate) fn flock(fd: c_int, op: c_int) -> c_int;
    pub(crate) fn unlink(path: *const c_char) -> c_int;
    pub(crate) fn sysconf(name: c_int) -> std::ffi::c_long;
    pub(crate) fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int;
    pub(crate) fn getpid() -> c_int;
    pub(crate) fn getppid() -> c_int;
    pub(crate) fn gettid() -> c_int;
    pub(crate) fn clock_gettime(clock: c_int, ts: *mut Timespec) -> c_int;
    pub(crate) fn nanosleep(req: *const Timespec, rem: *mut Timespec) -> c_int;
    fn syscall(number: std::ffi::c_long, ...) -> std::ffi::c_long;
    pub(crate) fn pthread_key_create(
        key: *mut u32,
        dtor: Option<unsafe extern "C" fn(*mut c_void)>,
    ) -> c_int;
    pub(crate) fn pthread_setspecific(key: u32, value: *const c_void) -> c_int;
    pub(crate) fn pthread_atfork(
        prepare: Option<unsafe extern "C" fn()>,
        parent: Option<unsafe extern "C" fn()>,
        child: Option<unsafe extern "C" fn()>,
    ) -> c_int;
    pub(crate) fn pthread_create(
        thread: *mut u64,
        attr: *const PthreadAttr,
        start: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
        arg: *mut c_void,
    ) -> c_int;
    pub(crate) fn pthread_attr_init(attr: *mut PthreadAttr) -> c_int;
    pub(crate) fn pthread_attr_destroy(attr: *mut PthreadAttr) -> c_int;
    pub(crate) fn pthread_attr_setstacksize(attr: *mut PthreadAttr, size: usize) -> c_int;
    pub(crate) fn pthread_attr_setdetachstate(attr: *mut PthreadAttr, state: c_int) -> c_int;
    pub(crate) fn pthread_sigmask(how: c_int, set: *const SigSet, old: *mut SigSet) -> c_int;
    pub(crate) fn prctl(option: c_int, ...) -> c_int;
    pub(crate) fn atexit(f: unsafe extern "C" fn()) -> c_int;
    pub(crate) fn signal(sig: c_int, handler: usize) -> usize;
    pub(crate) fn raise(sig: c_int) -> c_int;
    pub(crate) fn sched_yield() -> c_int;
    pub(crate) fn __errno_location() -> *mut c_int;
}

pub(crate) const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;
pub(crate) const O_RDONLY: c_int = 0;
pub(crate) const LOCK_EX: c_int = 2;
pub(crate) const LOCK_NB: c_int = 4;
pub(crate) const O_WRONLY: c_int = 1;
pub(crate) const O_CREAT: c_int = 0o100;
pub(crate) const O_EXCL: c_int = 0o200;
pub(crate) const O_APPEND: c_int = 0o2000;
pub(crate) const O_CLOEXEC: c_int = 0o2_000_000;
pub(crate) const EEXIST: c_int = 17;
pub(crate) const EINTR: c_int = 4;
pub(crate) const PROT_RW: c_int = 3;
pub(crate) const MAP_PRIVATE_ANON: c_int = 0x02 | 0x20;
pub(crate) const CLOCK_REALTIME: c_int = 0;
pub(crate) const CLOCK_MONOTONIC: c_int = 1;
pub(crate) const SIG_DFL: usize = 0;
pub(crate) const SIG_ERR: usize = usize::MAX;
pub(crate) const SIG_SETMASK: c_int = 2;
pub(crate) const PTHREAD_CREATE_DETACHED: c_int = 1;
pub(crate) const PR_SET_NAME: c_int = 15;
/// SIGHUP, SIGQUIT, SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGSEGV, SIGTERM, SIGXCPU, SIGXFSZ.
pub(crate) const FLUSH_SIGNALS: [c_int; 10] = [1, 3, 4, 6, 7, 8, 11, 15, 24, 25];

// The tracer's own mappings, and the program's that the tracer passes on
// (`crate::mappings`), go through the system calls themselves: the tracer exports `mmap`,
// `munmap` and `mremap`, so the C library's names would lead back to it.
#[cfg(target_arch = "x86_64")]
const SYS_MMAP: std::ffi::c_long = 9;
#[cfg(target_arch = "x86_64")]
const SYS_MUNMAP: std::ffi::c_long = 11;
#[cfg(target_arch = "x86_64")]
const SYS_MREMAP: std::ffi::c_long = 25;
// The generic system call table's numbers (AArch64, RISC-V, LoongArch).
#[cfg(any(
    target_arch = "aarch64",
    target_arch = "riscv64",
    target_arch = "loongarch64"
))]
const SYS_MMAP: std::ffi::c_long = 222;
#[cfg(any(
    target_arch = "aarch64",
    target_arch = "riscv64",
    target_arch = "loongarch64"
))]
const SYS_MUNMAP: std::ffi::c_long = 215;
#[cfg(any(
    target_arch = "aarch64",
    target_arch = "riscv64",
    target_arch = "loongarch64"
))]
const SYS_MREMAP: std::ffi::c_long = 216;
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64",
    target_arch = "loongarch64"
)))]
compile_error!(
    "the tracer knows the mapping system calls' numbers on x86-64, AArch64, RISC-V and LoongArch only"
);

/// `mmap(2)`: the mapping, or `-1` as a pointer with `errno` set (as the C library's).
pub(crate) unsafe fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    // SAFETY: the system call with the caller's arguments; `syscall` sets errno.
    unsafe { syscall(SYS_MMAP, addr, len, prot, flags, fd, off) as *mut c_void }
}

/// `munmap(2)`: 0, or -1 with `errno` set.
pub(crate) unsafe fn munmap(addr: *mut c_void, len: usize) -> c_int {
    // SAFETY: as `mmap`.
    unsafe { syscall(SYS_MUNMAP, addr, len) as c_int }
}

/// `mremap(2)`: the new address, or `-1` as a pointer with `errno` set.
pub(crate) unsafe fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    // SAFETY: as `mmap`.
    unsafe { syscall(SYS_MREMAP, old, old_len, new_len, flags, new_addr) as *mut c_void }
}
