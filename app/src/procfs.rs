//! What `/proc` says of a process, for the commands and the view-model on any architecture
//! (`attach`'s own reads, x86-64 only, are in `inject::target`).

/// Whether process `pid` exists and has not exited (a zombie waiting for its parent has).
pub fn running(pid: u32) -> bool {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command name, which is in parentheses and may hold anything.
    let state = text
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, None | Some("Z" | "X"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_runs_and_a_reaped_child_does_not() {
        assert!(running(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Exited, not reaped: a zombie.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!running(pid));
        child.wait().unwrap();
        assert!(!running(pid));
    }
}
