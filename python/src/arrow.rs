//! A polars DataFrame handed to Python through the Arrow C stream interface (the
//! `__arrow_c_stream__` PyCapsule protocol, which Python polars and pyarrow import).
//!
//! Nothing is copied on the way out: each chunk of each column is exported as the Arrow array
//! polars holds, its buffers shared by reference count and released by the consumer through the
//! stream's `release` callbacks. Python polars and pyarrow import those buffers in place.

use std::ffi::CStr;

use polars::prelude::{CompatLevel, DataFrame, PolarsResult, SchemaExt as _};
use polars_arrow::array::{Array, StructArray};
use polars_arrow::datatypes::{ArrowDataType, Field};
use polars_arrow::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// The capsule name the Arrow PyCapsule interface requires for a stream.
const STREAM_CAPSULE: &CStr = c"arrow_array_stream";

/// A table for Python: `polars.DataFrame(t)` or `pyarrow.table(t)` reads it.
#[pyclass(frozen, module = "allocview._native")]
pub struct ArrowTable {
    frame: DataFrame,
}

impl ArrowTable {
    pub fn new(frame: DataFrame) -> Self {
        Self { frame }
    }
}

#[pymethods]
impl ArrowTable {
    /// Rows in the table.
    #[getter]
    fn height(&self) -> usize {
        self.frame.height()
    }

    /// Column names, in order.
    #[getter]
    fn columns(&self) -> Vec<String> {
        self.frame
            .get_column_names()
            .iter()
            .map(|n| n.to_string())
            .collect()
    }

    /// A new stream over the table each call (the frame's chunks are shared, not copied), so
    /// a table can be read more than once. A requested schema is not honoured: the table's own
    /// types are given, as the protocol allows.
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        let stream = export_stream(&self.frame);
        PyCapsule::new_with_value(py, stream, STREAM_CAPSULE)
    }
}

/// The frame as an Arrow stream of struct arrays, one per record batch (polars' chunks).
fn export_stream(frame: &DataFrame) -> ffi::ArrowArrayStream {
    let compat = CompatLevel::newest();
    let schema = frame.schema().to_arrow(compat);
    let fields: Vec<Field> = schema.iter_values().cloned().collect();
    let dtype = ArrowDataType::Struct(fields);
    let batches: Vec<PolarsResult<Box<dyn Array>>> = if frame.width() == 0 {
        Vec::new()
    } else {
        frame
            .iter_chunks(compat, false)
            .map(|batch| {
                let len = batch.height();
                StructArray::try_new(dtype.clone(), len, batch.into_arrays(), None)
                    .map(|a| Box::new(a) as Box<dyn Array>)
            })
            .collect()
    };
    let field = Field::new("".into(), dtype, false);
    ffi::export_iterator(Box::new(batches.into_iter()), field)
}
