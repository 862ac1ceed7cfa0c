//! `allocview._native`: the Rust side of the Python package (`python/allocview/` wraps it).
//!
//! Every command here runs the answer of the `allocview` command of the same name
//! (`allocview::answers`, on the session of `allocview::session`), so `stats`, `compare`,
//! `sites` and `predict` give exactly the objects their `--json` prints (as JSON text, which
//! the wrapper parses). Loading and replaying run with
//! the GIL released (`Python::detach`); progress goes to an optional Python callable.
//!
//! - `arrow`: tables cross into Python through the Arrow C stream interface, without a copy;
//! - `progress`: the callback, fed from a counter while the work runs without the GIL;
//! - `snapshot`: `from_snapshot`, a PyTorch snapshot object turned into the loader's graph.

mod arrow;
mod progress;
mod snapshot;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use allocview::answers::compare::CompareOptions;
use allocview::answers::predict::PredictOptions;
use allocview::answers::sites::SitesQuery;
use allocview::session::InputArgs;
use allocview::session::input::{load_counted, warnings};
use allocview::session::{PolicyArgs, StreamArgs};
use allocview_loaders::Loaded;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use arrow::ArrowTable;
use progress::Progress;

create_exception!(
    _native,
    AllocviewError,
    PyException,
    "An input allocview cannot read, or a command it cannot run on it."
);

fn to_py(err: &anyhow::Error) -> PyErr {
    AllocviewError::new_err(format!("{err:#}"))
}

/// A loaded input: what `allocview` commands read, kept so several commands share one load.
#[pyclass(frozen, module = "allocview._native")]
pub struct Trace {
    loaded: Arc<Loaded>,
    /// The file it came from, or a name standing for it (`from_snapshot`).
    path: PathBuf,
}

#[pymethods]
impl Trace {
    /// The file (or the name given to `from_snapshot`).
    #[getter]
    fn path(&self) -> String {
        self.path.display().to_string()
    }

    /// What the loader noticed and kept going past (skipped lines, unknown frees, ...).
    #[getter]
    fn warnings(&self) -> Vec<String> {
        warnings(&self.loaded)
    }

    /// A trace recorded in a CPython interpreter, whose requests a loader reads in one of two
    /// views (`requests`: the objects, or what reached the C library).
    #[getter]
    fn recorded_in_python(&self) -> bool {
        match &*self.loaded {
            Loaded::MallocTrace(t) => {
                t.summary.python_allocator_events + t.summary.other_view_events > 0
            }
            _ => false,
        }
    }

    /// The input's tables as `allocview convert OUT.parquet` writes them, by name: `events`
    /// (the exported event table; a plan's `buffers`), then `threads`, `stacks`, `frames` and,
    /// for a PyTorch snapshot, `segments`, `blocks`, `segment_events`, `annotations`.
    fn tables(&self, py: Python<'_>) -> PyResult<Vec<(String, ArrowTable)>> {
        let loaded = Arc::clone(&self.loaded);
        let path = self.path.clone();
        let (main, others) = py
            .detach(move || allocview::answers::tables::tables_of(&loaded, &path))
            .map_err(|e| to_py(&e))?;
        let main_name = match &*self.loaded {
            Loaded::Plan(_) => "buffers",
            _ => "events",
        };
        let mut out = vec![(main_name.to_owned(), ArrowTable::new(main))];
        out.extend(
            others
                .into_iter()
                .map(|(name, frame)| (name.to_owned(), ArrowTable::new(frame))),
        );
        Ok(out)
    }
}

/// Loads `path`, reporting the bytes read to `progress` as `("load", done, total)`.
#[pyfunction]
#[pyo3(signature = (path, lenient = false, progress = None, requests = "objects"))]
fn load(
    py: Python<'_>,
    path: PathBuf,
    lenient: bool,
    progress: Option<Py<PyAny>>,
    requests: &str,
) -> PyResult<Trace> {
    let requests: allocview_loaders::Requests =
        requests.parse().map_err(AllocviewError::new_err)?;
    let total_bytes = std::fs::metadata(&path)
        .map_err(|e| AllocviewError::new_err(format!("cannot open {}: {e}", path.display())))?
        .len();
    let counter = Arc::new(AtomicU64::new(0));
    let watch = Progress::start(progress, "load", total_bytes, Arc::clone(&counter));
    let p = path.clone();
    let loaded = py.detach(move || {
        let loaded = load_counted(&p, lenient, requests, counter);
        watch.finish();
        loaded
    });
    let loaded = loaded.map_err(|e| to_py(&e))?;
    Ok(Trace {
        loaded: Arc::new(loaded),
        path,
    })
}

/// `allocview stats FILE --json --no-stream` (the trace is loaded), as JSON text.
#[pyfunction]
fn stats(py: Python<'_>, trace: &Trace) -> PyResult<String> {
    let loaded = Arc::clone(&trace.loaded);
    let path = trace.path.clone();
    py.detach(move || allocview::answers::stats::json(&loaded, &path, None))
        .map(|v| v.to_string())
        .map_err(|e| to_py(&e))
}

/// `allocview compare FILE --json`, as JSON text, and every policy's series (`report`'s
/// timeline: one row per policy and time bucket).
#[pyfunction]
#[pyo3(signature = (trace, policies, limit_bytes = None, min_limit = false, align_bytes = 16, jobs = None, progress = None))]
#[allow(clippy::too_many_arguments)]
fn compare(
    py: Python<'_>,
    trace: &Trace,
    policies: Vec<String>,
    limit_bytes: Option<u64>,
    min_limit: bool,
    align_bytes: u64,
    jobs: Option<usize>,
    progress: Option<Py<PyAny>>,
) -> PyResult<(String, ArrowTable)> {
    let args = CompareOptions {
        policies: PolicyArgs {
            policy: policies,
            limit: limit_bytes,
            align: align_bytes,
            jobs,
        },
        from_start: false,
        no_guidance: false,
        min_limit,
        // The trace is loaded whole.
        windowed: false,
    };
    let path = trace.path.clone();
    let (specs, real) = args.policies.specs_and_real().map_err(|e| to_py(&e))?;
    let real = allocview::answers::compare::with_program_allocator(&real).map_err(|e| to_py(&e))?;
    let n_policies = (specs.len() + real.len()) as u64;
    let counter = Arc::new(AtomicU64::new(0));
    let watch = Progress::start(progress, "replay", n_policies, Arc::clone(&counter));
    let loaded = Arc::clone(&trace.loaded);
    let out = py.detach(move || {
        let out = allocview::answers::compare::evaluate(&path, &args, &loaded, true, &counter);
        // A TensorFlow log's `bfc` at TensorFlow's addresses is not a replay: count it done.
        counter.store(n_policies, std::sync::atomic::Ordering::Relaxed);
        watch.finish();
        out.map(|c| (c.json(&path).to_string(), c.series))
    });
    let (json, series) = out.map_err(|e| to_py(&e))?;
    let series = series.unwrap_or_default();
    Ok((json, ArrowTable::new(series)))
}

/// The page `allocview report FILE --html OUT.html` writes, as HTML text: one self-contained
/// file (data, script and styles inside).
#[pyfunction]
#[pyo3(signature = (trace, policies, jobs = None))]
fn report_html(
    py: Python<'_>,
    trace: &Trace,
    policies: Vec<String>,
    jobs: Option<usize>,
) -> PyResult<String> {
    let args = PolicyArgs {
        policy: policies,
        limit: None,
        align: 16,
        jobs,
    };
    let path = trace.path.clone();
    let loaded = Arc::clone(&trace.loaded);
    py.detach(move || {
        allocview::html::report_page(&path, &loaded, &args)
            .and_then(|page| allocview::html::render(&page))
    })
    .map_err(|e| to_py(&e))
}

/// `allocview tune FILE [--limit] [--policy] --json`, as JSON text.
#[pyfunction]
#[pyo3(signature = (trace, limit_bytes = None, family = None, jobs = None))]
fn tune(
    py: Python<'_>,
    trace: &Trace,
    limit_bytes: Option<u64>,
    family: Option<String>,
    jobs: Option<usize>,
) -> PyResult<String> {
    let opts = allocview::answers::tune::TuneOptions {
        limit_bytes,
        family,
        jobs: jobs.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        }),
        replayed: None,
    };
    let path = trace.path.clone();
    let loaded = Arc::clone(&trace.loaded);
    py.detach(move || allocview::answers::tune::tune(&loaded, &path, &opts))
        .and_then(|t| serde_json::to_string(&t).map_err(anyhow::Error::from))
        .map_err(|e| to_py(&e))
}

/// `allocview sites FILE --json`, as JSON text.
#[pyfunction]
#[pyo3(signature = (trace, at = "peak".to_owned(), by = "function".to_owned(), policy = None))]
fn sites(
    py: Python<'_>,
    trace: &Trace,
    at: String,
    by: String,
    policy: Option<String>,
) -> PyResult<String> {
    let query = SitesQuery { at, by, policy };
    let path = trace.path.clone();
    let loaded = Arc::clone(&trace.loaded);
    py.detach(move || allocview::answers::sites::sites_json(&path, &query, &loaded))
        .map(|v| v.to_string())
        .map_err(|e| to_py(&e))
}

/// `allocview predict FILE --json`, as JSON text.
#[pyfunction]
#[pyo3(signature = (trace, model = None, order = 8, split = 0.8, train = None))]
fn predict(
    py: Python<'_>,
    trace: &Trace,
    model: Option<String>,
    order: usize,
    split: f64,
    train: Option<PathBuf>,
) -> PyResult<String> {
    let args = PredictOptions {
        model,
        order,
        split,
        train,
        input: InputArgs::default(),
        stream: StreamArgs::default(),
    };
    let path = trace.path.clone();
    let loaded = Arc::clone(&trace.loaded);
    py.detach(move || allocview::answers::predict::json(&path, &args, &loaded))
        .map(|v| v.to_string())
        .map_err(|e| to_py(&e))
}

/// A PyTorch memory snapshot from the object `torch.cuda.memory._snapshot()` returns (plain
/// dicts, lists, strings and numbers), read as the loader reads a snapshot file. `name` stands
/// for the file in the commands' output.
#[pyfunction]
#[pyo3(signature = (snapshot, name = "<snapshot>".to_owned()))]
fn from_snapshot(py: Python<'_>, snapshot: &Bound<'_, PyAny>, name: String) -> PyResult<Trace> {
    let graph = snapshot::to_graph(snapshot)?;
    let path = PathBuf::from(name);
    let p = path.clone();
    let snap = py
        .detach(move || snapshot::from_graph(&graph, &p))
        .map_err(|e| to_py(&e))?;
    Ok(Trace {
        loaded: Arc::new(Loaded::PytorchSnapshot(Box::new(snap))),
        path,
    })
}

/// The replay policies `compare` knows, in its default order.
#[pyfunction]
fn policy_names() -> Vec<&'static str> {
    allocview_sim::policy::registry::POLICY_NAMES.to_vec()
}

/// Parses a byte size as the command line does (`512MiB`, `2GiB`, `4096`).
#[pyfunction]
fn parse_bytes(text: &str) -> PyResult<u64> {
    allocview::units::parse_bytes(text).map_err(|e| AllocviewError::new_err(e.to_string()))
}

/// The tracer shared object that `allocview record` preloads, for `allocview.Tracker` to
/// load into this interpreter (empty where the tracer did not build).
#[pyfunction]
fn tracer_library(py: Python<'_>) -> Bound<'_, pyo3::types::PyBytes> {
    pyo3::types::PyBytes::new(py, allocview::recording::TRACER_SO)
}

/// Converts the spool of an in-process run into the binary trace `out` (stacks symbolized);
/// returns the events written, and the peak and final live bytes of the program's requests.
#[pyfunction]
fn spool_to_trace(
    py: Python<'_>,
    spool: PathBuf,
    out: PathBuf,
    program: String,
) -> PyResult<(u64, u64, u64)> {
    py.detach(move || allocview::recording::spool_to_trace(&spool, &out, &program))
        .map(|s| (s.events, s.peak_live_bytes, s.final_live_bytes))
        .map_err(|e| to_py(&e))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("AllocviewError", m.py().get_type::<AllocviewError>())?;
    m.add_class::<Trace>()?;
    m.add_class::<ArrowTable>()?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(stats, m)?)?;
    m.add_function(wrap_pyfunction!(compare, m)?)?;
    m.add_function(wrap_pyfunction!(sites, m)?)?;
    m.add_function(wrap_pyfunction!(tune, m)?)?;
    m.add_function(wrap_pyfunction!(report_html, m)?)?;
    m.add_function(wrap_pyfunction!(predict, m)?)?;
    m.add_function(wrap_pyfunction!(from_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(policy_names, m)?)?;
    m.add_function(wrap_pyfunction!(parse_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(tracer_library, m)?)?;
    m.add_function(wrap_pyfunction!(spool_to_trace, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
