//! Reading modules, and symbolizing locations, on a thread of its own while the traced
//! program runs.

use std::path::PathBuf;
use std::sync::mpsc;

use allocview_loaders::binary::{Location, NativeModule, SourceFrame};

use super::Symbolizer;

/// A [`Symbolizer`] that reads modules on a thread of its own while the traced program runs:
/// `record` sends it each module a stack uses as its conversion meets the first such stack,
/// and finds them read when the program exits (the C library's debug information alone takes
/// some 50 ms to read), instead of reading them all after. It also symbolizes the locations
/// of a trace written while the program runs, so that a follower of the trace sees functions
/// ([`ModuleFeed::symbolize`]).
pub struct Prefetch {
    tx: mpsc::Sender<Prefetched>,
    thread: Option<std::thread::JoinHandle<Symbolizer>>,
}

/// Sends modules to a [`Prefetch`]'s thread.
pub struct ModuleFeed(mpsc::Sender<Prefetched>);

impl ModuleFeed {
    /// Reads `file` on the thread (unless it was read).
    pub fn read(&self, file: &NativeModule) {
        // The reading needs no segments. A send fails only once the thread has stopped: the
        // module is then read when the stacks are symbolized.
        let file = NativeModule {
            segments: Vec::new(),
            ..file.clone()
        };
        self.0.send(Prefetched::Module(file)).ok();
    }

    /// Symbolizes `locations` (of `modules`) on the thread; their frames come back on `reply`,
    /// as a [`Symbolized`] of `trace` whose `first` location is `first`, in the order asked.
    /// Returns whether the thread was there to ask (once it has stopped, the caller
    /// symbolizes them itself).
    pub fn symbolize(
        &self,
        trace: PathBuf,
        first: usize,
        modules: &[NativeModule],
        locations: &[Location],
        reply: &mpsc::Sender<Symbolized>,
    ) -> bool {
        let request = Request {
            trace,
            first,
            modules: modules.to_vec(),
            locations: locations.to_vec(),
            reply: reply.clone(),
        };
        self.0
            .send(Prefetched::Symbolize(Box::new(request)))
            .is_ok()
    }
}

/// The source frames of a stretch of a trace's locations, symbolized on a [`Prefetch`]'s
/// thread.
pub struct Symbolized {
    pub trace: PathBuf,
    /// The index of the first location.
    pub first: usize,
    /// Per location (empty: unresolved).
    pub frames: Vec<Vec<SourceFrame>>,
}

struct Request {
    trace: PathBuf,
    first: usize,
    modules: Vec<NativeModule>,
    locations: Vec<Location>,
    reply: mpsc::Sender<Symbolized>,
}

enum Prefetched {
    Module(NativeModule),
    Symbolize(Box<Request>),
    Done,
}

impl Prefetch {
    /// Starts the reading thread (none when it cannot start: the modules are then read
    /// after the run, as without prefetching).
    #[must_use]
    pub fn start() -> Self {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("allocview-symbols".into())
            .spawn(move || {
                let mut symbolizer = Symbolizer::default();
                loop {
                    match rx.recv() {
                        Ok(Prefetched::Module(m)) => symbolizer.open(&m),
                        Ok(Prefetched::Symbolize(r)) => {
                            let frames = symbolizer.resolve(&r.modules, &r.locations);
                            // The converter may have gone on without them: they are then
                            // symbolized at the end.
                            let (trace, first) = (r.trace, r.first);
                            r.reply
                                .send(Symbolized {
                                    trace,
                                    first,
                                    frames,
                                })
                                .ok();
                        }
                        Ok(Prefetched::Done) | Err(_) => break,
                    }
                }
                symbolizer
            })
            .ok();
        Self { tx, thread }
    }

    /// Where to send the modules to read.
    #[must_use]
    pub fn feed(&self) -> ModuleFeed {
        ModuleFeed(self.tx.clone())
    }

    /// Waits for the modules sent so far, and hands over what was read.
    #[must_use]
    pub fn finish(mut self) -> Symbolizer {
        self.tx.send(Prefetched::Done).ok();
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::super::Opened;
    use super::*;

    #[test]
    fn modules_sent_to_a_prefetch_are_read_on_its_thread_once() {
        let exe = std::env::current_exe().unwrap().display().to_string();
        let module = |path: &str| NativeModule {
            path: path.to_owned(),
            segments: vec![(0x1000, 0x2000)],
            ..NativeModule::default()
        };
        let prefetch = Prefetch::start();
        let feed = prefetch.feed();
        feed.read(&module(&exe));
        feed.read(&module(&exe));
        feed.read(&module("/nonexistent/liby.so"));
        // What the thread read comes back with `finish`: this symbolizer opened nothing itself.
        let mut symbolizer = prefetch.finish();
        assert_eq!(symbolizer.modules.len(), 2);
        assert!(matches!(
            symbolizer.modules.get(&(exe.clone(), Vec::new())),
            Some(Opened::Read(_))
        ));
        let Some(Opened::Read(r)) = symbolizer.modules.get(&(exe.clone(), Vec::new())) else {
            unreachable!()
        };
        assert!(r.has_symbols());
        // The symbolization's own open finds it there.
        symbolizer.open(&module(&exe));
        assert_eq!(symbolizer.modules.len(), 2);
        // A feed that outlives its prefetch sends to no one, and does not fail.
        feed.read(&module("/nonexistent/libz.so"));
    }

    /// A function of this test binary, to be found by its address.
    #[inline(never)]
    fn a_function_to_find() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn locations_sent_to_a_prefetch_come_back_named_in_order() {
        use object::{Object as _, ObjectSymbol as _};
        assert_eq!(a_function_to_find(), 42);
        let exe = std::env::current_exe().unwrap();
        let bytes = std::fs::read(&exe).unwrap();
        let file = object::File::parse(&*bytes).unwrap();
        let addr = file
            .symbols()
            .find(|s| s.name().is_ok_and(|n| n.contains("a_function_to_find")))
            .expect("the test binary's symbol table names the function")
            .address();
        let modules = [NativeModule {
            path: exe.display().to_string(),
            ..NativeModule::default()
        }];
        // Return addresses: one past a call inside the function.
        let at = |offset: u64| Location {
            module: Some(0),
            offset,
        };
        let prefetch = Prefetch::start();
        let feed = prefetch.feed();
        let (tx, rx) = mpsc::channel();
        let trace = PathBuf::from("t.avt");
        assert!(feed.symbolize(trace.clone(), 5, &modules, &[at(addr + 2)], &tx));
        let jit = Location {
            module: None,
            offset: 0x7f00_0000_1234,
        };
        assert!(feed.symbolize(trace.clone(), 6, &modules, &[jit, at(addr + 1)], &tx));
        let first = rx.recv().unwrap();
        let second = rx.recv().unwrap();
        assert_eq!((first.trace.as_path(), first.first), (trace.as_path(), 5));
        assert_eq!(second.first, 6);
        let name = |f: &[SourceFrame]| f.first().map(|f| f.function.clone()).unwrap_or_default();
        assert!(
            name(&first.frames[0]).ends_with("a_function_to_find"),
            "{:?}",
            first.frames
        );
        assert_eq!(
            second.frames[0],
            Vec::new(),
            "code in no module is not named"
        );
        assert!(name(&second.frames[1]).ends_with("a_function_to_find"));
        drop(prefetch.finish());
        // Once the thread has stopped, asking says so: the caller symbolizes them itself.
        assert!(!feed.symbolize(trace, 8, &modules, &[at(addr + 1)], &tx));
    }
}
