//! Signal handlers that end, replace or fork the process while the tracer holds its locks:
//! a C program allocates in a tight loop while a 20 kHz timer interrupts it, and its handler
//! calls `_exit`, `exit`, `execve` or `fork` when the signal lands while the tracer writes a
//! buffer out (the interrupted thread is inside `writev`, holding the buffer's lock and the
//! file's). Each run must end (it used to spin forever on a lock its own thread held) and its
//! trace must be readable.

// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use allocview_loaders::{LoadOptions, Loaded};

mod common;

/// `argv[1]` names what the handler does; `argv[1] == "done"` is the image after `execve`.
/// Exit status 42: the handler acted; 3: no signal landed in `writev` within 20 s.
const HANDLER_C: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>
extern char **environ;
static const char *mode;
static char *self;
static uintptr_t writev_at;
static volatile sig_atomic_t forks;

static volatile sig_atomic_t armed;

/* The interrupted code is in writev (glibc's makes its system call inline): its pc, or the
   return address at its stack pointer (inside a call writev makes), lies in the function.
   The program itself never calls writev; the tracer does, with its locks held. Only those
   two words: deeper stack slots may hold stale addresses. */
static int in_writev(ucontext_t *uc) {
    uintptr_t pc = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    uintptr_t *sp = (uintptr_t *)uc->uc_mcontext.gregs[REG_RSP];
    return pc - writev_at < 256 || sp[0] - writev_at < 256;
}

static void on_alarm(int sig, siginfo_t *info, void *ctx) {
    (void)sig; (void)info;
    /* Armed once the loop has written a few buffers whole (the trace has their events); in
       fork mode, disarmed after 20 forks (the pending signal would otherwise be handled again
       at the same instruction forever). */
    if (!armed || forks >= 20 || !in_writev((ucontext_t *)ctx)) return;
    if (strcmp(mode, "_exit") == 0) _exit(42);
    if (strcmp(mode, "exit") == 0) exit(42);
    if (strcmp(mode, "execve") == 0) {
        char *args[] = {self, "done", NULL};
        execve(self, args, environ);
        _exit(5);
    }
    if (strcmp(mode, "fork") == 0) {
        pid_t child = fork();
        if (child == 0) _exit(0);
        if (child > 0) waitpid(child, NULL, 0);
        forks++;
    }
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (strcmp(argv[1], "done") == 0) return 42;
    mode = argv[1];
    self = argv[0];
    writev_at = (uintptr_t)dlsym(RTLD_DEFAULT, "writev");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_alarm;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval every = {{0, 50}, {0, 50}};
    setitimer(ITIMER_REAL, &every, NULL);
    void *keep[64] = {0};
    time_t start = time(NULL);
    for (unsigned long i = 0;; i++) {
        free(keep[i & 63]);
        keep[i & 63] = malloc(16 + ((i * 7919) & 4095));
        if (i == 2000000) armed = 1;
        if (forks >= 20) exit(42);
        if ((i & 0xffff) == 0 && time(NULL) - start > 20) return 3;
    }
}
"#;

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("record-signals-{name}"));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Records the program in `mode` (killed by `timeout` after 60 s: a hang fails the test) and
/// checks that the handler acted and that every trace written loads.
fn record_handler(mode: &str) {
    let dir = scratch(&mode.replace('_', "underscore-"));
    let exe = common::build_c(&dir, "handler", HANDLER_C);
    let out_path = dir.join("h.avt");
    let mut child = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(["record", "-o", out_path.to_str().unwrap(), "--"])
        .args(["timeout", "-s", "KILL", "60"])
        .arg(&exe)
        .arg(mode)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(180) {
            child.kill().ok();
            child.wait().ok();
            panic!("{mode}: record did not end");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
    // record exits with the traced command's status: the handler's 42 (below), not 0.
    assert_eq!(status.code(), Some(42), "{mode}: {status}\n{stderr}");
    assert!(
        !["exit status: 124", "exit status: 137", "signal: 9"]
            .iter()
            .any(|s| stderr.contains(s)),
        "{mode}: the traced program hung (a signal handler waited for a lock its own thread \
         held) and was killed after 60 s\n{stderr}"
    );
    assert!(
        stderr.contains("exit status: 42"),
        "{mode}: the handler did not act (status 3: no signal landed in writev)\n{stderr}"
    );
    let traces: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "avt"))
        .collect();
    assert!(!traces.is_empty(), "{mode}: no trace\n{stderr}");
    let mut events = 0;
    for t in &traces {
        let loaded = allocview_loaders::load(t, &LoadOptions::default())
            .unwrap_or_else(|e| panic!("{mode}: {} does not load: {e}", t.display()));
        let Loaded::MallocTrace(trace) = loaded else {
            panic!("{} is not a malloc trace", t.display());
        };
        events += trace.events.height();
    }
    // The loop's first 2,000,000 calls came before the handler was armed: most of their events
    // were written by then (the buffer being filled may be lost with the process).
    assert!(events > 1_000_000, "{mode}: {events} events\n{stderr}");
}

#[test]
fn a_handler_calling_underscore_exit_while_the_tracer_writes_ends_the_program() {
    record_handler("_exit");
}

#[test]
fn a_handler_calling_exit_while_the_tracer_writes_ends_the_program() {
    record_handler("exit");
}

#[test]
fn a_handler_calling_execve_while_the_tracer_writes_replaces_the_program() {
    record_handler("execve");
}

#[test]
fn a_handler_forking_while_the_tracer_writes_goes_on() {
    record_handler("fork");
}
