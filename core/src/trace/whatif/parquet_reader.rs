//! What-if traces stored as Parquet (the format of the OSDI'25 artifact's `trace-*.parquet`).
//!
//! Owns: opening a Parquet file with the `parquet` crate's row API (no Arrow), checking its
//! schema against [`WHATIF_COLUMNS`] (found by name; extra columns such as a pandas index are
//! ignored) and handing each row to the shared [`WhatifAccumulator`]. Must not touch: the
//! latency derivation (that is [`super`]'s, one path for CSV and Parquet) or tuning.
//!
//! Accepted physical types: integer columns INT32 or INT64; `optype` BYTE_ARRAY (UTF-8);
//! `start_ts`, `duration` DOUBLE or FLOAT (seconds). Page compression: none, Snappy, Zstd or
//! Gzip (the crate features enabled in Cargo.toml); other codecs give a
//! [`TraceError::Malformed`] carrying the `parquet` crate's message.

use std::path::Path;

use parquet::basic::Type as PhysicalType;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use parquet::schema::types::Type;

use super::{WHATIF_COLUMNS, WhatifAccumulator, WhatifRecord};
use crate::trace::{LoadOptions, Loaded, TraceError};

/// Indices into [`WHATIF_COLUMNS`] of the string and floating-point columns; all others are
/// integers.
const TEXT_COLUMN: usize = 4;
const FLOAT_COLUMNS: [usize; 2] = [5, 6];

fn malformed(path: &Path, line: u64, column: &str, message: String) -> TraceError {
    TraceError::Malformed { path: path.into(), line, column: column.into(), message }
}

/// Check that every column of [`WHATIF_COLUMNS`] is a top-level primitive column of an
/// accepted physical type, and return the projection (the 11 columns, in file order) and, for
/// each schema column i, its position in a projected row.
fn project(path: &Path, root: &Type) -> Result<(Type, [usize; WHATIF_COLUMNS.len()]), TraceError> {
    let fields = root.get_fields();
    let mut chosen = Vec::with_capacity(WHATIF_COLUMNS.len());
    for (i, name) in WHATIF_COLUMNS.iter().enumerate() {
        let Some(f) = fields.iter().find(|f| f.name() == *name) else {
            let have: Vec<&str> = fields.iter().map(|f| f.name()).collect();
            return Err(malformed(path, 0, name, format!("missing column (file has {have:?})")));
        };
        let ok = f.is_primitive()
            && match f.get_physical_type() {
                PhysicalType::INT32 | PhysicalType::INT64 => i != TEXT_COLUMN && !FLOAT_COLUMNS.contains(&i),
                PhysicalType::DOUBLE | PhysicalType::FLOAT => FLOAT_COLUMNS.contains(&i),
                PhysicalType::BYTE_ARRAY => i == TEXT_COLUMN,
                _ => false,
            };
        if !ok {
            let expected = if i == TEXT_COLUMN {
                "BYTE_ARRAY (string)"
            } else if FLOAT_COLUMNS.contains(&i) {
                "DOUBLE or FLOAT"
            } else {
                "INT32 or INT64"
            };
            let found = if f.is_primitive() { format!("{:?}", f.get_physical_type()) } else { "a group".into() };
            return Err(malformed(path, 0, name, format!("physical type {found}, expected {expected}")));
        }
        chosen.push(f.clone());
    }
    // File order: the row reader then walks the column chunks in order.
    chosen.sort_by_key(|c| fields.iter().position(|f| f.name() == c.name()));
    let mut pos = [0; WHATIF_COLUMNS.len()];
    for (i, name) in WHATIF_COLUMNS.iter().enumerate() {
        pos[i] = chosen.iter().position(|c| c.name() == *name).unwrap_or(i);
    }
    let proj = Type::group_type_builder(root.name())
        .with_fields(chosen)
        .build()
        .map_err(|e| malformed(path, 0, "(schema)", format!("cannot build projection: {e}")))?;
    Ok((proj, pos))
}

/// One projected Parquet row with its file and 1-based row number.
struct ParquetRecord<'a> {
    path: &'a Path,
    row: u64,
    cols: &'a [(String, Field)],
    pos: &'a [usize; WHATIF_COLUMNS.len()],
}

impl ParquetRecord<'_> {
    fn field(&self, col: usize) -> Result<&Field, TraceError> {
        match self.cols.get(self.pos[col]).map(|c| &c.1) {
            Some(Field::Null) => Err(self.bad(col, "null value".into())),
            Some(f) => Ok(f),
            None => Err(self.bad(col, format!("row has only {} columns", self.cols.len()))),
        }
    }
    fn bad(&self, col: usize, message: String) -> TraceError {
        malformed(self.path, self.row, WHATIF_COLUMNS[col], message)
    }
}

impl WhatifRecord for ParquetRecord<'_> {
    fn int(&self, col: usize) -> Result<i64, TraceError> {
        match *self.field(col)? {
            Field::Byte(v) => Ok(v.into()),
            Field::Short(v) => Ok(v.into()),
            Field::Int(v) => Ok(v.into()),
            Field::Long(v) => Ok(v),
            Field::UByte(v) => Ok(v.into()),
            Field::UShort(v) => Ok(v.into()),
            Field::UInt(v) => Ok(v.into()),
            Field::ULong(v) => i64::try_from(v).map_err(|_| self.bad(col, format!("{v} out of range"))),
            ref other => Err(self.bad(col, format!("expected an integer, found {other:?}"))),
        }
    }
    fn float(&self, col: usize) -> Result<f64, TraceError> {
        match *self.field(col)? {
            Field::Double(v) => Ok(v),
            Field::Float(v) => Ok(v.into()),
            ref other => Err(self.bad(col, format!("expected a floating-point number, found {other:?}"))),
        }
    }
    fn text(&self, col: usize) -> Result<&str, TraceError> {
        match self.field(col)? {
            Field::Str(s) => Ok(s),
            Field::Bytes(b) => b.as_utf8().map_err(|e| self.bad(col, format!("not UTF-8: {e}"))),
            other => Err(self.bad(col, format!("expected a string, found {other:?}"))),
        }
    }
}

/// Load one what-if Parquet file into the same trace [`super::load_csv`] builds from the same
/// rows. Errors: [`TraceError::Input`] if the file cannot be opened, is not a regular file or is above
/// the trace size cap (`crate::input`); [`TraceError::Malformed`]
/// with line 0 and the column's name for a missing column or an unaccepted physical type, with
/// line 0 and column `(file)` for unreadable metadata, with the 1-based row and column
/// `(row)` when a row cannot be decoded (corrupt page, disabled codec), and with the row and
/// column for null or out-of-range values; then every error of the shared derivation
/// (duplicates, ragged steps unless `opts.allow_incomplete_steps`, no complete step).
pub fn load_parquet(path: &Path, opts: &LoadOptions) -> Result<Loaded, TraceError> {
    let file = crate::input::open_regular(path, crate::input::InputKind::Trace)?;
    let reader = SerializedFileReader::new(file).map_err(|e| malformed(path, 0, "(file)", e.to_string()))?;
    let (proj, pos) = project(path, reader.metadata().file_metadata().schema())?;
    let rows = reader.get_row_iter(Some(proj)).map_err(|e| malformed(path, 0, "(file)", e.to_string()))?;
    let mut acc = WhatifAccumulator::new(path);
    for (i, row) in rows.enumerate() {
        let row_no = i as u64 + 1;
        let cols = row.map_err(|e| malformed(path, row_no, "(row)", e.to_string()))?.into_columns();
        acc.push(row_no, &ParquetRecord { path, row: row_no, cols: &cols, pos: &pos })?;
    }
    acc.finish(opts)
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::path::PathBuf;
    use std::sync::Arc;

    use parquet::basic::{Compression, GzipLevel, ZstdLevel};
    use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int32Type, Int64Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;

    use super::*;
    use crate::trace::load;

    /// One what-if op, the fields of [`WHATIF_COLUMNS`] in order.
    type Op = (i64, i64, i64, i64, &'static str, f64, f64, i64, i64, i64, i64);

    const STEPS: i64 = 3;
    const DP: i64 = 2;
    const STAGES: i64 = 2;
    const MBS: i64 = 2;

    /// Forward and backward duration (s) of (step, dp, stage, mb): distinct values, exact in
    /// decimal so the CSV round trip is lossless.
    fn durations(step: i64, dp: i64, stage: i64, mb: i64) -> (f64, f64) {
        let k = ((step * 7 + dp * 5 + stage * 3 + mb * 11) % 13) as f64;
        (0.010 + 0.001 * k, 0.020 + 0.002 * ((k * 3.0) % 7.0))
    }

    /// 3 steps x 2 replicas x 2 stages x 2 micro-batches of forward + backward, plus one
    /// optimizer op (mb_id -1) per worker ending after all compute.
    fn ops() -> Vec<Op> {
        let mut v = Vec::new();
        for step in 0..STEPS {
            let t0 = step as f64 * 10.0;
            for dp in 0..DP {
                for st in 0..STAGES {
                    let rank = dp * STAGES + st;
                    for mb in 0..MBS {
                        let (f, b) = durations(step, dp, st, mb);
                        let t = t0 + mb as f64;
                        v.push((dp, st, rank, step, "forward-compute", t, f, mb, 0, mb, mb));
                        v.push((dp, st, rank, step, "backward-compute", t + 0.5, b, mb, 0, mb, mb));
                    }
                    v.push((dp, st, rank, step, "optimizer", t0 + 5.0, 0.25, -1, 0, -1, -1));
                }
            }
        }
        v
    }

    thread_local! {
        /// This test's private directory (each test runs on its own thread): removed when the
        /// test's thread ends, and never shared with a test running in parallel.
        static DIR: tempfile::TempDir = tempfile::Builder::new().prefix("dropcompute-parquet-").tempdir().expect("temp dir");
    }

    fn temp(name: &str) -> PathBuf {
        DIR.with(|d| d.path().join(name))
    }

    fn write_csv(ops: &[Op]) -> PathBuf {
        let mut s = WHATIF_COLUMNS.join(",") + "\n";
        for o in ops {
            s += &format!("{},{},{},{},{},{},{},{},{},{},{}\n", o.0, o.1, o.2, o.3, o.4, o.5, o.6, o.7, o.8, o.9, o.10);
        }
        let p = temp("same.csv");
        std::fs::write(&p, s).expect("write csv");
        p
    }

    /// Write `ops` as Parquet with integer columns mixing INT32 and INT64, optionally without
    /// column `skip`.
    fn write_parquet(name: &str, ops: &[Op], compression: Compression, skip: Option<&str>) -> PathBuf {
        let types =
            ["INT64", "INT32", "INT64", "INT32", "BYTE_ARRAY", "DOUBLE", "DOUBLE", "INT64", "INT32", "INT32", "INT64"];
        let fields: String =
            WHATIF_COLUMNS
                .iter()
                .zip(types)
                .filter(|(n, _)| Some(**n) != skip)
                .map(|(n, t)| {
                    if t == "BYTE_ARRAY" {
                        format!("REQUIRED {t} {n} (UTF8);\n")
                    } else {
                        format!("REQUIRED {t} {n};\n")
                    }
                })
                .collect();
        let schema = Arc::new(parse_message_type(&format!("message schema {{\n{fields}}}")).expect("schema"));
        let props = Arc::new(WriterProperties::builder().set_compression(compression).build());
        let p = temp(name);
        let mut w = SerializedFileWriter::new(File::create(&p).expect("create"), schema, props).expect("writer");
        let mut rg = w.next_row_group().expect("row group");
        let names: Vec<&str> = WHATIF_COLUMNS.iter().copied().filter(|n| Some(*n) != skip).collect();
        let mut k = 0;
        while let Some(mut col) = rg.next_column().expect("column") {
            let i = WHATIF_COLUMNS.iter().position(|n| *n == names[k]).expect("known column");
            k += 1;
            let ints = |o: &Op| [o.0, o.1, o.2, o.3, 0, 0, 0, o.7, o.8, o.9, o.10][i];
            match types[i] {
                "INT64" => {
                    let v: Vec<i64> = ops.iter().map(ints).collect();
                    col.typed::<Int64Type>().write_batch(&v, None, None).expect("i64");
                }
                "INT32" => {
                    let v: Vec<i32> = ops.iter().map(|o| i32::try_from(ints(o)).expect("small")).collect();
                    col.typed::<Int32Type>().write_batch(&v, None, None).expect("i32");
                }
                "DOUBLE" => {
                    let v: Vec<f64> = ops.iter().map(|o| if i == 5 { o.5 } else { o.6 }).collect();
                    col.typed::<DoubleType>().write_batch(&v, None, None).expect("f64");
                }
                _ => {
                    let v: Vec<ByteArray> = ops.iter().map(|o| ByteArray::from(o.4)).collect();
                    col.typed::<ByteArrayType>().write_batch(&v, None, None).expect("str");
                }
            }
            col.close().expect("close column");
        }
        rg.close().expect("close row group");
        w.close().expect("close file");
        p
    }

    #[test]
    fn parquet_matches_csv_for_every_codec_and_the_f64_reference() {
        let ops = ops();
        let opts = LoadOptions::default();
        let csv = load(&[write_csv(&ops)], &opts).expect("csv").remove(0).trace;
        // f64 reference straight from the generator: bottleneck over stages of fwd + bwd.
        let mut want = Vec::new();
        for step in 0..STEPS {
            for dp in 0..DP {
                for mb in 0..MBS {
                    let per_stage = (0..STAGES).map(|st| {
                        let (f, b) = durations(step, dp, st, mb);
                        (f + b) * 1e9
                    });
                    want.push(per_stage.fold(0.0, f64::max));
                }
            }
        }
        assert_eq!(csv.latencies_ns(), want.as_slice());
        let codecs = [
            ("plain", Compression::UNCOMPRESSED),
            ("snappy", Compression::SNAPPY),
            ("zstd", Compression::ZSTD(ZstdLevel::default())),
            ("gzip", Compression::GZIP(GzipLevel::default())),
        ];
        for (name, c) in codecs {
            let p = write_parquet(&format!("trace-{name}.parquet"), &ops, c, None);
            let pq = load(std::slice::from_ref(&p), &opts).expect(name).remove(0).trace;
            assert_eq!((pq.num_steps(), pq.world_size(), pq.micro_batches()), (3, 2, 2), "{name}");
            assert_eq!(pq.ranks(), csv.ranks(), "{name}");
            assert_eq!(pq.steps(), csv.steps(), "{name}");
            assert_eq!(pq.latencies_ns(), csv.latencies_ns(), "{name}");
            assert_eq!(pq.overhead_ns(), csv.overhead_ns(), "{name}");
            assert!(pq.overhead_ns().iter().all(|&o| o > 0.0), "{name}: {:?}", pq.overhead_ns());
        }
    }

    #[test]
    fn missing_column_and_bad_row_are_named() {
        let ops = ops();
        let p = write_parquet("no-mb.parquet", &ops, Compression::SNAPPY, Some("mb_id"));
        match load(&[p], &LoadOptions::default()) {
            Err(TraceError::Malformed { line: 0, column, message, .. }) => {
                assert_eq!(column, "mb_id");
                assert!(message.contains("missing column"), "{message}");
            }
            other => panic!("expected Malformed mb_id, got {other:?}"),
        }
        // Row 4 (1-based) gets a negative duration: the shared checks name row and column.
        let mut bad = ops.clone();
        bad[3].6 = -1.0;
        let p = write_parquet("negative.parquet", &bad, Compression::UNCOMPRESSED, None);
        match load(&[p], &LoadOptions::default()) {
            Err(TraceError::Malformed { line, column, .. }) => assert_eq!((line, column.as_str()), (4, "duration")),
            other => panic!("expected Malformed duration, got {other:?}"),
        }
    }
}
