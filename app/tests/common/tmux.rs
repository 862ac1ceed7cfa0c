//! The terminal explorer in tmux: a detached session running a command, real keys, the screen
//! read back with capture-pane.

use std::process::Command;
use std::time::{Duration, Instant};

/// A detached tmux session, killed when dropped.
pub struct Session(pub String);

impl Drop for Session {
    fn drop(&mut self) {
        Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .output()
            .ok();
    }
}

/// Whether tmux is missing: the test then skips, with a message (CI, which installs it, sets
/// `ALLOCVIEW_REQUIRE_TEST_INPUTS` and fails instead).
pub fn tmux_missing() -> bool {
    if Command::new("tmux").arg("-V").output().is_ok() {
        return false;
    }
    assert!(
        std::env::var_os("ALLOCVIEW_REQUIRE_TEST_INPUTS").is_none(),
        "a required test tool is missing: tmux"
    );
    eprintln!("skipping: tmux is not installed (CI installs it)");
    true
}

/// Runs tmux with `args`; its standard output.
pub fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What the session's screen shows.
pub fn capture(s: &Session) -> String {
    tmux(&["capture-pane", "-t", &s.0, "-p"])
}

/// Polls the screen until `pred` holds (the explorer loads and replays in the background).
pub fn wait_for(s: &Session, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let screen = capture(s);
        if pred(&screen) {
            return screen;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}; screen:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A detached tmux session `name` of `width` x `height` running `cmd`.
pub fn start(name: String, width: u16, height: u16, cmd: &str) -> Session {
    let (w, h) = (width.to_string(), height.to_string());
    let out = Command::new("tmux")
        .args(["new-session", "-d", "-s", &name, "-x", &w, "-y", &h, cmd])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Session(name)
}

/// Sends `keys` to the session.
pub fn keys(s: &Session, keys: &[&str]) {
    let mut args = vec!["send-keys", "-t", &s.0];
    args.extend_from_slice(keys);
    tmux(&args);
}
