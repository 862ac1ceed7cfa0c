//! The dump as DataFrames ([`super::DumpFrames`]).

use polars::prelude::*;

use super::builder::Builder;
use super::{DumpFrames, SummaryRow};

impl Builder {
    pub(super) fn frames(&self) -> PolarsResult<DumpFrames> {
        let regions = df_from(vec![
            col_u32(
                "region",
                (0..self.regions.len())
                    .map(|i| u32::try_from(i).ok())
                    .collect(),
            ),
            col_u64("address", self.regions.iter().map(|r| r.address).collect()),
            col_u64(
                "size_bytes",
                self.regions.iter().map(|r| Some(r.size_bytes)).collect(),
            ),
            col_u64("line", self.regions.iter().map(|r| r.line).collect()),
        ])?;
        let c = &self.chunks;
        let chunks = df_from(vec![
            col_u64("address", c.iter().map(|c| Some(c.address)).collect()),
            col_u64("size_bytes", c.iter().map(|c| Some(c.size_bytes)).collect()),
            Column::new(
                "in_use".into(),
                c.iter().map(|c| c.in_use).collect::<Vec<_>>(),
            ),
            col_u64(
                "requested_bytes",
                c.iter().map(|c| c.requested_bytes).collect(),
            ),
            UInt8Chunked::from_vec("bin".into(), c.iter().map(|c| c.bin).collect()).into_column(),
            col_u64("next_handle", c.iter().map(|c| c.next_handle).collect()),
            col_u32("region", c.iter().map(|c| c.region).collect()),
            col_u64("line", c.iter().map(|c| Some(c.line)).collect()),
        ])?;
        let b = &self.bins;
        let bins = df_from(vec![
            UInt8Chunked::from_vec("bin".into(), b.iter().map(|b| b.bin).collect()).into_column(),
            col_u64(
                "bin_size_bytes",
                b.iter().map(|b| Some(b.bin_size_bytes)).collect(),
            ),
            col_u64(
                "total_chunks",
                b.iter().map(|b| Some(b.total_chunks)).collect(),
            ),
            col_u64(
                "chunks_in_use",
                b.iter().map(|b| Some(b.chunks_in_use)).collect(),
            ),
            col_u64(
                "allocated_bytes",
                b.iter().map(|b| Some(b.allocated.bytes)).collect(),
            ),
            col_u64(
                "in_use_bytes",
                b.iter().map(|b| Some(b.in_use.bytes)).collect(),
            ),
            col_u64(
                "requested_in_use_bytes",
                b.iter().map(|b| Some(b.requested_in_use.bytes)).collect(),
            ),
            col_u64("line", b.iter().map(|b| Some(b.line)).collect()),
        ])?;
        let s = &self.summary;
        let in_use_summary = df_from(vec![
            col_u64("size_bytes", s.iter().map(|r| Some(r.size_bytes)).collect()),
            col_u64("count", s.iter().map(|r| Some(r.count)).collect()),
            col_u64(
                "total_bytes",
                s.iter().map(SummaryRow::total_bytes).collect(),
            ),
            col_u64("line", s.iter().map(|r| Some(r.line)).collect()),
        ])?;
        let st = &self.stats;
        let stats = df_from(vec![
            Column::new(
                "label".into(),
                st.iter().map(|s| s.label.as_str()).collect::<Vec<_>>(),
            ),
            Column::new(
                "key".into(),
                st.iter().map(|s| s.key.as_str()).collect::<Vec<_>>(),
            ),
            Column::new(
                "text".into(),
                st.iter().map(|s| s.text.as_str()).collect::<Vec<_>>(),
            ),
            col_u64("bytes", st.iter().map(|s| Some(s.value.bytes)).collect()),
            col_u64(
                "min_bytes",
                st.iter().map(|s| Some(s.value.min_bytes)).collect(),
            ),
            col_u64(
                "max_bytes",
                st.iter().map(|s| Some(s.value.max_bytes)).collect(),
            ),
            col_u64("line", st.iter().map(|s| Some(s.line)).collect()),
        ])?;
        Ok(DumpFrames {
            regions,
            chunks,
            bins,
            in_use_summary,
            stats,
        })
    }
}
pub(crate) fn col_u64(name: &str, values: Vec<Option<u64>>) -> Column {
    UInt64Chunked::from_iter_options(name.into(), values.into_iter()).into_column()
}

fn col_u32(name: &str, values: Vec<Option<u32>>) -> Column {
    UInt32Chunked::from_iter_options(name.into(), values.into_iter()).into_column()
}

pub(crate) fn df_from(columns: Vec<Column>) -> PolarsResult<DataFrame> {
    let height = columns.first().map_or(0, Column::len);
    DataFrame::new(height, columns)
}
