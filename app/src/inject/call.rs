//! Calling a function inside another process with ptrace (x86-64 Linux).
//!
//! One thread of the target is stopped ([`Hijack::new`]: `PTRACE_SEIZE`, then
//! `PTRACE_INTERRUPT`); the others keep running, so that a lock one of them holds is released
//! and the tracer's flush, which waits for every thread's buffer, can end. The thread chosen
//! is one stopped inside a system call that is not one of the C library allocator's own
//! (`mmap`, `brk`...): a thread stopped in the middle of `malloc`, holding its arena's lock,
//! would deadlock in the `malloc` that `dlopen` makes. A process whose threads never block
//! (busy in its own code) is taken, after [`SYSCALL_PREFERRED`], at a stop in code outside
//! the C library, the dynamic loader and any allocator library.
//!
//! [`Hijack::call`] saves the thread's registers (general and floating-point), builds a call
//! frame below the stack pointer and its 128-byte red zone (the arguments' strings, then a
//! return address of 0, the stack aligned as the ABI wants at a call), sets `orig_rax` to -1
//! so that the kernel does not restart the interrupted system call over the call, and lets the
//! thread run until it returns to address 0 and faults. The registers are then put back
//! exactly, and the interrupted system call restarts as if nothing happened. Signals that
//! arrive for the thread meanwhile are held and delivered when it is let go.

use std::os::unix::fs::FileExt as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::errno::Errno;
use nix::libc::user_regs_struct;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use super::target::permission_message;

/// The x86-64 SysV red zone below the stack pointer, which the interrupted code may use.
const RED_ZONE_BYTES: u64 = 128;
/// How long a call may take (dlopen of the tracer reads its file and relocates it).
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// How long to look for a thread stopped in a safe place.
const CHOOSE_TIMEOUT: Duration = Duration::from_secs(10);
/// `PTRACE_EVENT_STOP`: the stop `PTRACE_INTERRUPT` causes.
const PTRACE_EVENT_STOP: i32 = 128;
/// How long to wait for a thread stopped in a system call before taking one stopped in the
/// program's own code.
const SYSCALL_PREFERRED: Duration = Duration::from_secs(2);
/// The C library allocator's own system calls (mmap, mprotect, munmap, brk, mremap, madvise):
/// a thread stopped in one may be inside `malloc`, holding its arena's lock.
const ALLOCATOR_SYSCALLS: [u64; 6] = [9, 10, 11, 12, 25, 28];

/// One argument of a call.
pub enum Arg<'a> {
    Int(u64),
    /// A NUL-terminated copy of the string, written below the stack pointer.
    Str(&'a str),
}

/// A thread of the target, stopped and ready to make calls; let go on drop.
pub struct Hijack {
    pid: i32,
    tid: Pid,
    saved: user_regs_struct,
    saved_fp: nix::libc::user_fpregs_struct,
    /// Signals that arrived for the thread while it was held, delivered when it is let go.
    pending: Vec<Signal>,
    mem: std::fs::File,
    released: bool,
}

impl Hijack {
    /// Stops a thread of process `pid` in a place where it may call the C library (see the
    /// module documentation).
    ///
    /// # Errors
    /// When ptrace is refused (a message that says why and what to do), the process went
    /// away, or no thread stopped in a safe place within [`CHOOSE_TIMEOUT`].
    pub fn new(pid: i32) -> Result<Self> {
        let started = Instant::now();
        let deadline = started + CHOOSE_TIMEOUT;
        let unsafe_code = locking_code(pid)?;
        let mut first = true;
        loop {
            let anywhere_safe = started.elapsed() > SYSCALL_PREFERRED;
            for tid in threads(pid)? {
                let safe = |regs: &user_regs_struct| {
                    if (regs.orig_rax as i64) >= 0 {
                        !ALLOCATOR_SYSCALLS.contains(&regs.orig_rax)
                    } else {
                        anywhere_safe
                            && !unsafe_code
                                .iter()
                                .any(|&(start, end)| start <= regs.rip && regs.rip < end)
                    }
                };
                match Self::try_thread(pid, tid, first, safe) {
                    Ok(Some(h)) => return Ok(h),
                    Ok(None) => {}
                    // A thread that ended between the listing and the seize.
                    Err(e) if e.downcast_ref::<Errno>() == Some(&Errno::ESRCH) => {}
                    Err(e) => return Err(e),
                }
                first = false;
            }
            if Instant::now() > deadline {
                bail!(
                    "no thread of process {pid} stopped outside the memory allocator within {} \
                     s (every thread was busy in user code or in mmap/brk); try again",
                    CHOOSE_TIMEOUT.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Seizes and stops `tid`; keeps it when `safe` says its registers are a safe place, else
    /// lets it go.
    fn try_thread(
        pid: i32,
        tid: i32,
        first: bool,
        safe: impl Fn(&user_regs_struct) -> bool,
    ) -> Result<Option<Self>> {
        let t = Pid::from_raw(tid);
        match ptrace::seize(t, ptrace::Options::empty()) {
            Ok(()) => {}
            Err(Errno::EPERM) if first => {
                bail!("{}", permission_message(pid, "PTRACE_SEIZE was refused"))
            }
            Err(Errno::ESRCH) => return Err(Errno::ESRCH.into()),
            Err(e) => {
                return Err(e).with_context(|| format!("PTRACE_SEIZE of thread {tid} of {pid}"));
            }
        }
        ptrace::interrupt(t).with_context(|| format!("PTRACE_INTERRUPT of thread {tid}"))?;
        let mut pending = Vec::new();
        wait_for_stop(t, &mut pending)?;
        let regs =
            ptrace::getregs(t).with_context(|| format!("reading thread {tid}'s registers"))?;
        if !safe(&regs) {
            ptrace::detach(t, pending.first().copied()).ok();
            return Ok(None);
        }
        let saved_fp = ptrace::getregset::<ptrace::regset::NT_PRFPREG>(t)
            .with_context(|| format!("reading thread {tid}'s floating-point registers"))?;
        let mem = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .with_context(|| format!("opening /proc/{pid}/mem"))?;
        Ok(Some(Self {
            pid,
            tid: t,
            saved: regs,
            saved_fp,
            pending,
            mem,
            released: false,
        }))
    }

    /// Reads a NUL-terminated string of at most `max` bytes at `addr` in the target.
    pub fn read_c_string(&self, addr: u64, max: usize) -> Result<String> {
        let mut buf = vec![0u8; max];
        let n = self
            .mem
            .read_at(&mut buf, addr)
            .with_context(|| format!("reading the memory of process {}", self.pid))?;
        buf.truncate(n);
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }

    /// Calls the function at `func` with `args` on the stopped thread; returns its `rax`.
    ///
    /// # Errors
    /// When the target cannot be written, the call faults elsewhere than on its return, the
    /// process exits, or the call does not return within [`CALL_TIMEOUT`].
    pub fn call(&mut self, func: u64, args: &[Arg<'_>]) -> Result<u64> {
        self.call_within(func, args, CALL_TIMEOUT)
    }

    /// [`Self::call`], given up after `timeout`: the thread is then stopped where the call
    /// got to and, when the [`Hijack`] is let go, put back where it was before the call (a
    /// thread left running the call would return to address 0 and kill the process).
    fn call_within(&mut self, func: u64, args: &[Arg<'_>], timeout: Duration) -> Result<u64> {
        if args.len() > 6 {
            bail!("at most six arguments are passed in registers");
        }
        let mut regs = self.saved;
        // Strings first, below the red zone; then the return address.
        let mut sp = self.saved.rsp - RED_ZONE_BYTES;
        let mut values = Vec::with_capacity(args.len());
        for a in args {
            match a {
                Arg::Int(v) => values.push(*v),
                Arg::Str(s) => {
                    let mut bytes = s.as_bytes().to_vec();
                    bytes.push(0);
                    sp = (sp - bytes.len() as u64) & !15;
                    self.write(sp, &bytes)?;
                    values.push(sp);
                }
            }
        }
        // At the function's first instruction, rsp + 8 is a multiple of 16.
        sp &= !15;
        sp -= 8;
        self.write(sp, &0u64.to_le_bytes())?;
        let slots = [
            &mut regs.rdi,
            &mut regs.rsi,
            &mut regs.rdx,
            &mut regs.rcx,
            &mut regs.r8,
            &mut regs.r9,
        ];
        for (slot, v) in slots.into_iter().zip(values) {
            *slot = v;
        }
        regs.rsp = sp;
        regs.rip = func;
        regs.rax = 0;
        // Not in a system call any more: the kernel must not restart it over the call.
        regs.orig_rax = u64::MAX;
        ptrace::setregs(self.tid, regs).context("setting the call's registers")?;
        ptrace::cont(self.tid, None).context("resuming the thread for the call")?;
        let deadline = Instant::now() + timeout;
        loop {
            let status = waitpid(self.tid, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG))
                .context("waiting for the call")?;
            match status {
                WaitStatus::StillAlive => {
                    if Instant::now() > deadline {
                        return self.abandon_call(timeout);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                WaitStatus::Stopped(_, Signal::SIGSEGV) => {
                    let now = ptrace::getregs(self.tid).context("reading the call's result")?;
                    if now.rip != 0 {
                        bail!(
                            "the call in process {} crashed at {:#x} (SIGSEGV); the process \
                             was left as it was before the call",
                            self.pid,
                            now.rip
                        );
                    }
                    return Ok(now.rax);
                }
                WaitStatus::Stopped(_, sig) => {
                    // Held for later: the program's handler runs once the thread is let go.
                    self.pending.push(sig);
                    ptrace::cont(self.tid, None).context("resuming the thread")?;
                }
                WaitStatus::PtraceEvent(..) | WaitStatus::PtraceSyscall(_) => {
                    ptrace::cont(self.tid, None).context("resuming the thread")?;
                }
                WaitStatus::Exited(..) | WaitStatus::Signaled(..) => {
                    self.released = true;
                    bail!("process {} ended during the call", self.pid);
                }
                WaitStatus::Continued(_) => {}
            }
        }
    }

    /// Stops the thread inside a call that did not return in time, so that its registers can
    /// be put back (a thread running is out of ptrace's reach); the call's result if it
    /// returned meanwhile.
    fn abandon_call(&mut self, timeout: Duration) -> Result<u64> {
        ptrace::interrupt(self.tid).context("stopping the thread of a call that did not return")?;
        loop {
            match waitpid(self.tid, Some(WaitPidFlag::__WALL))
                .context("waiting for the thread to stop")?
            {
                WaitStatus::PtraceEvent(_, _, PTRACE_EVENT_STOP) => break,
                WaitStatus::Stopped(_, Signal::SIGSEGV) => {
                    let now = ptrace::getregs(self.tid).context("reading the call's result")?;
                    if now.rip == 0 {
                        return Ok(now.rax);
                    }
                    break;
                }
                WaitStatus::Stopped(_, sig) => {
                    self.pending.push(sig);
                    ptrace::cont(self.tid, None).context("resuming the thread")?;
                }
                WaitStatus::Exited(..) | WaitStatus::Signaled(..) => {
                    self.released = true;
                    bail!("process {} ended during the call", self.pid);
                }
                _ => {}
            }
        }
        bail!(
            "the call in process {} did not return within {} s (a lock held by a stopped \
             thread?); it was abandoned and the thread put back where it was",
            self.pid,
            timeout.as_secs_f64()
        )
    }

    fn write(&self, addr: u64, bytes: &[u8]) -> Result<()> {
        self.mem
            .write_all_at(bytes, addr)
            .with_context(|| format!("writing the stack of process {}", self.pid))
    }

    /// Puts the thread's registers back and lets it go (with the signals held meanwhile).
    pub fn release(mut self) -> Result<()> {
        self.restore()
    }

    fn restore(&mut self) -> Result<()> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        ptrace::setregset::<ptrace::regset::NT_PRFPREG>(self.tid, self.saved_fp)
            .context("restoring the thread's floating-point registers")?;
        ptrace::setregs(self.tid, self.saved).context("restoring the thread's registers")?;
        let mut signals = self.pending.drain(..);
        let first = signals.next();
        for sig in signals {
            // Further signals are sent again: they stay pending until the thread runs.
            nix::sys::signal::kill(Pid::from_raw(self.pid), sig).ok();
        }
        ptrace::detach(self.tid, first).context("detaching from the thread")?;
        Ok(())
    }
}

impl Drop for Hijack {
    fn drop(&mut self) {
        // An error path: the thread must run again whatever happened.
        self.restore().ok();
    }
}

/// Waits for `tid`'s stop after `PTRACE_INTERRUPT`; signals it stopped for first are kept in
/// `pending` (and the thread resumed until the interrupt's own stop).
fn wait_for_stop(tid: Pid, pending: &mut Vec<Signal>) -> Result<()> {
    loop {
        match waitpid(tid, Some(WaitPidFlag::__WALL)).context("waiting for the thread to stop")? {
            WaitStatus::PtraceEvent(_, _, PTRACE_EVENT_STOP) => return Ok(()),
            WaitStatus::Stopped(_, sig) => {
                pending.push(sig);
                ptrace::cont(tid, None).context("resuming the thread")?;
            }
            WaitStatus::Exited(..) | WaitStatus::Signaled(..) => {
                return Err(Errno::ESRCH.into());
            }
            _ => {}
        }
    }
}

/// The executable mappings of the code that may hold an allocator's lock: the C library, the
/// dynamic loader, and any library named like an allocator (jemalloc, tcmalloc, mimalloc).
fn locking_code(pid: i32) -> Result<Vec<(u64, u64)>> {
    Ok(super::target::mappings(pid)?
        .into_iter()
        .filter(|m| {
            let name = m.path.rsplit('/').next().unwrap_or(&m.path);
            m.executable
                && (name.starts_with("libc.so")
                    || name.starts_with("libc-")
                    || name.starts_with("ld-linux")
                    || name.starts_with("libpthread")
                    || name.contains("malloc"))
        })
        .map(|m| (m.start, m.end))
        .collect())
}

/// The thread ids of `pid`, the main thread first.
fn threads(pid: i32) -> Result<Vec<i32>> {
    let dir = format!("/proc/{pid}/task");
    let mut tids: Vec<i32> = std::fs::read_dir(&dir)
        .with_context(|| format!("listing {dir}"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable_by_key(|&t| (t != pid, t));
    Ok(tids)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test
    use super::*;

    /// The address of the C library's `name` in process `pid`.
    fn libc_function(pid: i32, name: &str) -> u64 {
        let maps = super::super::target::mappings(pid).unwrap();
        let libc = super::super::target::libc_path(&maps).unwrap().to_owned();
        let base = super::super::target::base_of(&maps, &libc).unwrap();
        let elf = std::fs::read(super::super::target::in_root(pid, &libc)).unwrap();
        super::super::target::symbol_address(&elf, base, name, std::path::Path::new(&libc))
            .unwrap()
            .unwrap()
    }

    /// A call that never returns (`pause`) is given up: the thread is put back in its
    /// `sleep`, which ends as it would have, instead of returning from `pause` to address 0
    /// (or staying in it for good) once let go.
    #[test]
    fn a_call_that_does_not_return_is_abandoned_and_the_thread_put_back() {
        let mut child = std::process::Command::new("sleep")
            .arg("1.5")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        // Its main thread is in clock_nanosleep once the program has started.
        std::thread::sleep(Duration::from_millis(200));
        let pause = libc_function(pid, "pause");
        let mut thread = Hijack::new(pid).unwrap();
        let started = Instant::now();
        let err = thread
            .call_within(pause, &[], Duration::from_millis(300))
            .unwrap_err();
        assert!(format!("{err:#}").contains("abandoned"), "{err:#}");
        assert!(started.elapsed() < Duration::from_secs(5));
        thread.release().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                child.kill().ok();
                panic!("the program did not go on after the call was abandoned");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "{status:?}");
    }
}
