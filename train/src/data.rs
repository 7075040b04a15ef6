//! The training data set: dense f32 features and integer class labels, loaded from CSV (plain or
//! gzip) or from the embedded UCI digits, scaled to [0, 1], split into train/holdout by seed, and
//! gathered into micro-batches by sample id.
//!
//! Owns: [`Dataset`], [`DataError`] and the CSV format below. Must not touch: the model
//! ([`super::mlp`]), devices, or the order in which samples are scheduled (the driver decides
//! which sample ids form a micro-batch; this module only gathers them).
//!
//! # File format
//! One sample per line, comma separated, no header: `dim` feature columns (any f32 syntax,
//! finite) then the class label last (a non-negative integer below [`MAX_CLASSES`]; `3` and
//! `3.0` are accepted, `3.5` is [`DataError::Malformed`]). Every line has the same number of
//! fields. Blank lines are skipped. A header line is tolerated only as the first line and only
//! when *none* of its fields parses as a number (e.g. `p0,p1,...,label`); a first line mixing
//! numbers and text is [`DataError::Malformed`]. Gzip is detected from the magic bytes
//! `1f 8b`, never from the file name; concatenated gzip members are read as one stream.
//!
//! # Scaling
//! Features are divided by the largest feature value of the whole file (16 for the digits), or
//! left as read when that maximum is <= 0, so non-negative data lands in [0, 1]. Subsets made
//! by [`Dataset::split`] keep the parent's scaling.

#![forbid(unsafe_code)]

use std::io::Read;
use std::path::{Path, PathBuf};

use rand::SeedableRng;
use rand::seq::SliceRandom;

use dropcompute::sim::rng::StableRng;

/// Labels must be below this (classes are `0..=max label`; the output layer has one unit per
/// class, so a stray huge label would otherwise allocate a huge model).
pub const MAX_CLASSES: u32 = 1024;

/// The embedded UCI digits (1797 rows, 64 pixel columns 0..16, label 0..9; see data/README.md).
/// Classes of the built-in digits (labels 0..=9).
pub const DIGITS_CLASSES: u32 = 10;

const DIGITS_GZ: &[u8] = include_bytes!("../../data/digits.csv.gz");
/// Source name of the embedded digits in errors.
const DIGITS_NAME: &str = "<embedded data/digits.csv.gz>";

/// Why a data set could not be loaded, split or gathered. Lines and columns are 1-based.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// The bounded reader refused the file (`dropcompute::input`, kind data: absent, a
    /// directory, a size or line cap, a stop signal while waiting for a FIFO).
    #[error("{0}")]
    Input(#[from] dropcompute::input::InputError),
    /// Reading the file failed.
    #[error("data {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The gzip stream ended early or is corrupt (e.g. a truncated download).
    #[error("data {path}: gzip stream truncated or corrupt while reading line {line}: {source}")]
    Decompress {
        /// The file.
        path: PathBuf,
        /// The line being read when decompression failed.
        line: u64,
        /// The decoder's error.
        #[source]
        source: std::io::Error,
    },
    /// A field is not a number (or the label not an integer), or the line is not valid CSV.
    #[error("data {path}:{line}: column {column}: {reason}: {value:?}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// Line of the record.
        line: u64,
        /// Column of the field (0 when the whole record is at fault).
        column: usize,
        /// The offending text (possibly empty).
        value: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A line has a different number of fields than the first data line.
    #[error("data {path}:{line}: {got} fields, expected {expected} (as on the first data line)")]
    Ragged {
        /// The file.
        path: PathBuf,
        /// Line of the record.
        line: u64,
        /// Fields of the first data line.
        expected: usize,
        /// Fields of this line.
        got: usize,
    },
    /// A label is negative or >= the class count (`--classes`, at most [`MAX_CLASSES`]).
    #[error("data {path}:{line}: column {column}: label {label} outside 0..{classes} (--classes {classes})")]
    LabelOutOfRange {
        /// The file.
        path: PathBuf,
        /// Line of the record.
        line: u64,
        /// Column of the label (the last field), 1-based.
        column: usize,
        /// The label read.
        label: i64,
        /// The class count labels must stay below.
        classes: u32,
    },
    /// A feature is infinite or NaN.
    #[error("data {path}:{line}: column {column} is not finite")]
    NonFinite {
        /// The file.
        path: PathBuf,
        /// Line of the record.
        line: u64,
        /// Column of the field.
        column: usize,
    },
    /// No data line.
    #[error("data {path}: no samples")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// Fewer than two distinct labels: nothing to classify.
    #[error("data {path}: {distinct} distinct label(s), need at least 2")]
    TooFewClasses {
        /// The file.
        path: PathBuf,
        /// Distinct labels found.
        distinct: usize,
    },
    /// [`Dataset::split`] got a fraction outside [0, 1) or one leaving no training sample.
    #[error("holdout fraction {fraction} of {rows} samples leaves no training sample or is not in [0, 1)")]
    InvalidSplit {
        /// The fraction given.
        fraction: f64,
        /// Samples in the data set.
        rows: usize,
    },
    /// A sample id passed to [`Dataset::rows`] is not below the number of samples.
    #[error("sample id {id} out of range (data set has {len} samples)")]
    SampleOutOfRange {
        /// The id.
        id: u64,
        /// Samples in the data set.
        len: usize,
    },
    /// [`Dataset::rows_padded`] got more ids than the micro-batch size.
    #[error("{ids} sample ids do not fit a micro-batch of {batch}")]
    BatchOverflow {
        /// Ids given.
        ids: usize,
        /// Micro-batch size.
        batch: usize,
    },
}

/// A classification data set held in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    /// `len() x dim` features, row-major, scaled as described in the module docs.
    pub features: Vec<f32>,
    /// One label per sample, each `< classes`.
    pub labels: Vec<u32>,
    /// Features per sample.
    pub dim: usize,
    /// Number of classes: the count given to the parser (`--classes`), or the largest label of
    /// the source plus one when none was given.
    pub classes: usize,
}

impl Dataset {
    /// The embedded UCI handwritten digits: 1797 samples, `dim` 64 (8x8 pixel counts / 16),
    /// 10 classes. Source and licence: data/README.md.
    ///
    /// # Errors
    /// None in practice (the embedded file is valid); the same errors as [`Dataset::from_bytes`].
    pub fn embedded_digits() -> Result<Self, DataError> {
        Self::parse_bytes(DIGITS_GZ, Path::new(DIGITS_NAME), Some(DIGITS_CLASSES))
    }

    /// Reads a CSV or gzip CSV file (format in the module docs) whose labels are classes
    /// `0..classes` (`train --classes`, 2..=[`MAX_CLASSES`]).
    ///
    /// # Errors
    /// [`DataError::Input`] when the bounded reader (`dropcompute::input`, kind data) refuses
    /// the file (absent, a directory, a size or line cap, a stop signal while waiting for a
    /// FIFO); [`DataError::LabelOutOfRange`] naming the line and column of the first label
    /// outside `0..classes`; otherwise as [`Dataset::from_bytes`].
    pub fn load(path: impl AsRef<Path>, classes: u32) -> Result<Self, DataError> {
        let path = path.as_ref();
        let input = dropcompute::input::open(path, dropcompute::input::InputKind::Data)?;
        let gzip = input.is_gzip();
        Self::parse(input, gzip, path, Some(classes))
    }

    /// Parses CSV or gzip CSV content; `source` names it in errors.
    ///
    /// # Errors
    /// [`DataError::Decompress`], [`DataError::Malformed`], [`DataError::Ragged`],
    /// [`DataError::LabelOutOfRange`], [`DataError::NonFinite`], [`DataError::Empty`],
    /// [`DataError::TooFewClasses`], each naming `source` and the 1-based line.
    pub fn from_bytes(bytes: &[u8], source: impl AsRef<Path>) -> Result<Self, DataError> {
        Self::parse_bytes(bytes, source.as_ref(), None)
    }

    /// [`Dataset::parse`] of content held in memory, gunzipped when it starts with the gzip
    /// magic.
    fn parse_bytes(bytes: &[u8], path: &Path, classes: Option<u32>) -> Result<Self, DataError> {
        let gzip = bytes.starts_with(&[0x1f, 0x8b]);
        let input: Box<dyn Read + '_> =
            if gzip { Box::new(flate2::read::MultiGzDecoder::new(bytes)) } else { Box::new(bytes) };
        Self::parse(input, gzip, path, classes)
    }

    /// Parses decoded CSV from `input` (`gzip`: read through a gzip decoder, whose I/O errors
    /// are a truncated or corrupt stream), labels checked against `classes` when given (and the
    /// class count set to it), else inferred as the largest label plus one.
    fn parse(input: impl Read, gzip: bool, path: &Path, classes: Option<u32>) -> Result<Self, DataError> {
        let (input, lines) = dropcompute::csv_lines::LineIndex::new(input);
        let mut reader =
            csv::ReaderBuilder::new().has_headers(false).flexible(true).trim(csv::Trim::All).from_reader(input);
        let limit = classes.unwrap_or(MAX_CLASSES).min(MAX_CLASSES);
        let mut p = Parser {
            path,
            lines,
            limit,
            fixed_classes: classes.is_some(),
            width: None,
            features: Vec::new(),
            labels: Vec::new(),
            last_line: 0,
            records: 0,
        };
        let mut record = csv::StringRecord::new();
        loop {
            match reader.read_record(&mut record) {
                Ok(false) => break,
                Ok(true) => p.record(&record)?,
                Err(e) => return Err(p.csv_error(e, gzip)),
            }
        }
        p.finish()
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when there is no sample.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Splits into `(train, holdout)` by [`holdout_split`]: `round(len * holdout_fraction)`
    /// samples chosen uniformly at random go to holdout, the rest to train. Both keep the original sample order and this set's `dim`, `classes` and scaling. Not
    /// stratified. Same inputs and seed give the same split.
    ///
    /// # Errors
    /// [`DataError::InvalidSplit`] when the fraction is not in [0, 1) or leaves train empty.
    pub fn split(&self, holdout_fraction: f64, seed: u64) -> Result<(Dataset, Dataset), DataError> {
        let (train, hold) = holdout_split(self.len(), holdout_fraction, seed)?;
        Ok((self.subset(&train), self.subset(&hold)))
    }

    fn subset(&self, ids: &[usize]) -> Dataset {
        let mut features = Vec::with_capacity(ids.len() * self.dim);
        for &i in ids {
            features.extend_from_slice(&self.features[i * self.dim..(i + 1) * self.dim]);
        }
        let labels = ids.iter().map(|&i| self.labels[i]).collect();
        Dataset { features, labels, dim: self.dim, classes: self.classes }
    }

    /// Gathers samples `ids` into a micro-batch: `(x, labels)` with `x` of `ids.len() x dim`
    /// (row-major) and labels as i32 (the layout the forward/backward graph takes, after
    /// `model_graphs::stage_labels`).
    ///
    /// # Errors
    /// [`DataError::SampleOutOfRange`] for an id >= `len()`.
    pub fn rows(&self, ids: &[u64]) -> Result<(Vec<f32>, Vec<i32>), DataError> {
        self.rows_padded(ids, ids.len())
    }

    /// As [`Dataset::rows`], padded to `batch` rows: padding rows have zero features and label
    /// -1 (ignored by `mlp::forward_backward`), so every micro-batch of a recipe has one size.
    ///
    /// # Errors
    /// [`DataError::BatchOverflow`] when `ids.len() > batch`; [`DataError::SampleOutOfRange`].
    pub fn rows_padded(&self, ids: &[u64], batch: usize) -> Result<(Vec<f32>, Vec<i32>), DataError> {
        if ids.len() > batch {
            return Err(DataError::BatchOverflow { ids: ids.len(), batch });
        }
        let mut x = vec![0.0f32; batch * self.dim];
        let mut y = vec![-1i32; batch];
        for (r, &id) in ids.iter().enumerate() {
            let i = usize::try_from(id)
                .ok()
                .filter(|&i| i < self.len())
                .ok_or(DataError::SampleOutOfRange { id, len: self.len() })?;
            x[r * self.dim..(r + 1) * self.dim].copy_from_slice(&self.features[i * self.dim..(i + 1) * self.dim]);
            // Labels are < MAX_CLASSES (checked at load), so they fit i32.
            y[r] = self.labels[i] as i32;
        }
        Ok((x, y))
    }
}

/// The one train/holdout rule of every data set of `train` (the digits' [`Dataset::split`],
/// the text corpus' `text::Corpus::split`): of `n` items, `round(n * holdout_fraction)` chosen
/// uniformly at random (shuffle of `0..n` with [`StableRng`]`::seed_from_u64(seed)`) are held
/// out, the rest train. Returns `(train, holdout)` indices, each ascending. Same inputs, same
/// split.
///
/// # Errors
/// [`DataError::InvalidSplit`] when the fraction is not in [0, 1) or leaves train empty.
pub fn holdout_split(n: usize, holdout_fraction: f64, seed: u64) -> Result<(Vec<usize>, Vec<usize>), DataError> {
    let invalid = DataError::InvalidSplit { fraction: holdout_fraction, rows: n };
    if !(0.0..1.0).contains(&holdout_fraction) {
        return Err(invalid);
    }
    let n_hold = held_out_count(n, holdout_fraction);
    if n_hold >= n {
        return Err(invalid);
    }
    let mut ids: Vec<usize> = (0..n).collect();
    ids.shuffle(&mut StableRng::seed_from_u64(seed));
    let (hold, train) = ids.split_at_mut(n_hold);
    hold.sort_unstable();
    train.sort_unstable();
    Ok((train.to_vec(), hold.to_vec()))
}

/// Items [`holdout_split`] holds out of `n` at `holdout_fraction`: `round(n * holdout_fraction)`
/// (half away from zero), the one place that rounding is written.
pub fn held_out_count(n: usize, holdout_fraction: f64) -> usize {
    (n as f64 * holdout_fraction).round() as usize
}

/// The fewest items [`holdout_split`] splits at `holdout_fraction` into at least one held-out
/// and one training item ([`held_out_count`] in `1..n`; every larger count does too: the
/// held-out count grows with `n`, and so does the training count, `n` minus a rounding that
/// grows by at most 1 per item). Searched from `0.5 / min(f, 1 - f)`, where the rounding first
/// reaches 1 on the smaller side. `None` for a fraction outside (0, 1) or one needing more than
/// 2^50 items.
pub fn min_split_items(holdout_fraction: f64) -> Option<u64> {
    if !(holdout_fraction > 0.0 && holdout_fraction < 1.0) {
        return None;
    }
    let near = 0.5 / holdout_fraction.min(1.0 - holdout_fraction);
    if near >= (1u64 << 50) as f64 {
        return None;
    }
    let start = (near.floor() as u64).saturating_sub(2).max(2);
    (start..start + 64).find(|&n| (1..n as usize).contains(&held_out_count(n as usize, holdout_fraction)))
}

/// Parsing state of [`Dataset::from_bytes`].
struct Parser<'p> {
    path: &'p Path,
    /// Physical lines of the input (`\n` or `\r\n` endings).
    lines: dropcompute::csv_lines::LineMap,
    /// Labels must be in `0..limit`.
    limit: u32,
    /// The class count is `limit` (given), not inferred from the labels.
    fixed_classes: bool,
    /// Fields per line, fixed by the first data line.
    width: Option<usize>,
    features: Vec<f32>,
    labels: Vec<u32>,
    /// Line of the last record read (for errors the CSV reader cannot place).
    last_line: u64,
    /// Records read so far (a header may only be the first).
    records: u64,
}

impl Parser<'_> {
    fn record(&mut self, rec: &csv::StringRecord) -> Result<(), DataError> {
        let line = rec.position().map_or(self.last_line + 1, |p| self.lines.line_of(p.byte()));
        self.last_line = line;
        self.records += 1;
        let path = || self.path.to_path_buf();
        let malformed = |column: usize, value: &str, reason| DataError::Malformed {
            path: path(),
            line,
            column,
            value: value.to_string(),
            reason,
        };
        let width = match self.width {
            Some(w) => w,
            None => {
                if self.records == 1 && rec.iter().all(|f| f.parse::<f64>().is_err()) {
                    return Ok(()); // a header line: no field is a number
                }
                if rec.len() < 2 {
                    return Err(malformed(0, rec.as_slice(), "need at least one feature column and a label"));
                }
                self.width = Some(rec.len());
                rec.len()
            }
        };
        if rec.len() != width {
            return Err(DataError::Ragged { path: path(), line, expected: width, got: rec.len() });
        }
        for (c, field) in rec.iter().take(width - 1).enumerate() {
            let v: f32 = field.parse().map_err(|_| malformed(c + 1, field, "not a number"))?;
            if !v.is_finite() {
                return Err(DataError::NonFinite { path: path(), line, column: c + 1 });
            }
            self.features.push(v);
        }
        let field = &rec[width - 1];
        let label = parse_label(field).ok_or_else(|| malformed(width, field, "label is not an integer"))?;
        if !(0..i64::from(self.limit)).contains(&label) {
            return Err(DataError::LabelOutOfRange { path: path(), line, column: width, label, classes: self.limit });
        }
        self.labels.push(label as u32);
        Ok(())
    }

    fn csv_error(&self, e: csv::Error, gzip: bool) -> DataError {
        let line = e.position().map_or(self.last_line + 1, |p| self.lines.line_of(p.byte()));
        let path = self.path.to_path_buf();
        match e.into_kind() {
            csv::ErrorKind::Io(source) => match dropcompute::input::InputError::from_io(source) {
                Ok(refused) => DataError::Input(refused),
                Err(source) if gzip => DataError::Decompress { path, line, source },
                Err(source) => DataError::Io { path, source },
            },
            csv::ErrorKind::Utf8 { .. } => {
                DataError::Malformed { path, line, column: 0, value: String::new(), reason: "invalid UTF-8" }
            }
            _ => DataError::Malformed { path, line, column: 0, value: String::new(), reason: "invalid CSV" },
        }
    }

    fn finish(self) -> Result<Dataset, DataError> {
        let path = self.path.to_path_buf();
        let Some(width) = self.width else { return Err(DataError::Empty { path }) };
        let mut seen = vec![false; MAX_CLASSES as usize];
        for &l in &self.labels {
            seen[l as usize] = true;
        }
        let distinct = seen.iter().filter(|&&s| s).count();
        if distinct < 2 {
            return Err(DataError::TooFewClasses { path, distinct });
        }
        let classes = if self.fixed_classes {
            self.limit as usize
        } else {
            self.labels.iter().max().map_or(0, |&m| m as usize + 1)
        };
        let mut features = self.features;
        let max = features.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if max > 0.0 {
            features.iter_mut().for_each(|v| *v /= max);
        }
        Ok(Dataset { features, labels: self.labels, dim: width - 1, classes })
    }
}

/// An integer label: integer syntax, or a float with no fractional part ("3.0").
fn parse_label(field: &str) -> Option<i64> {
    field.parse::<i64>().ok().or_else(|| {
        let v: f64 = field.parse().ok()?;
        (v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15).then_some(v as i64)
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use proptest::prelude::*;

    use super::*;

    fn gz(text: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(text).unwrap();
        e.finish().unwrap()
    }

    fn parse(text: &str) -> Result<Dataset, DataError> {
        Dataset::from_bytes(text.as_bytes(), "t.csv")
    }

    #[test]
    fn embedded_digits_shape_scaling_and_first_rows() {
        let d = Dataset::embedded_digits().unwrap();
        assert_eq!((d.len(), d.dim, d.classes), (1797, 64, 10));
        assert_eq!(d.features.len(), 1797 * 64);
        assert!(d.features.iter().all(|v| (0.0..=1.0).contains(v)));
        assert_eq!(d.features.iter().copied().fold(0.0f32, f32::max), 1.0);
        // First line of data/digits.csv.gz: "0,0,5,13,9,1,0,0,..." label 0; second has label 1.
        assert_eq!(&d.features[..6], &[0.0, 0.0, 5.0 / 16.0, 13.0 / 16.0, 9.0 / 16.0, 1.0 / 16.0]);
        assert_eq!(&d.labels[..2], &[0, 1]);
        let mut counts = [0usize; 10];
        d.labels.iter().for_each(|&l| counts[l as usize] += 1);
        assert!(counts.iter().all(|&c| (170..=190).contains(&c)), "{counts:?}");
    }

    #[test]
    fn gzip_detected_by_magic_not_extension() {
        let tmp = tempfile::Builder::new().prefix("dc-data-").tempdir().unwrap();
        let dir = tmp.path();
        let text = b"0,2,4,0\n1,0,8,1\n";
        std::fs::write(dir.join("plain.gz"), text).unwrap();
        std::fs::write(dir.join("zipped.csv"), gz(text)).unwrap();
        let a = Dataset::load(dir.join("plain.gz"), 10).unwrap();
        let b = Dataset::load(dir.join("zipped.csv"), 10).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.features, vec![0.0, 0.25, 0.5, 0.125, 0.0, 1.0]);
        // The class count is the one given (--classes), not the largest label + 1.
        assert_eq!((a.dim, a.classes, a.labels.clone()), (3, 10, vec![0, 1]));
        let e = Dataset::load(dir.join("missing.csv"), 10).unwrap_err();
        assert!(
            matches!(&e, DataError::Input(dropcompute::input::InputError::Io { path, op: "open", .. }) if path.ends_with("missing.csv")),
            "{e:?}"
        );
    }

    #[test]
    fn header_only_when_fully_non_numeric() {
        let d = parse("a,b,label\n1,2,0\n3,4,1\n").unwrap();
        assert_eq!(d.len(), 2);
        let e = parse("a,b,label\nc,d,e\n1,2,0\n").unwrap_err();
        assert!(matches!(e, DataError::Malformed { line: 2, column: 1, .. }), "only one header line: {e:?}");
        let e = parse("a,2,label\n1,2,0\n").unwrap_err();
        assert!(matches!(e, DataError::Malformed { line: 1, column: 1, .. }), "{e:?}");
        assert!(matches!(parse("a,b,label\n").unwrap_err(), DataError::Empty { .. }));
        assert!(matches!(parse("").unwrap_err(), DataError::Empty { .. }));
        // A second non-numeric line is data, hence malformed.
        let e = parse("1,2,0\na,b,c\n").unwrap_err();
        assert!(matches!(e, DataError::Malformed { line: 2, column: 1, .. }), "{e:?}");
    }

    #[test]
    fn errors_name_line_column_and_value() {
        let e = parse("1,2,0\n1,x,1\n").unwrap_err();
        match &e {
            DataError::Malformed { line, column, value, .. } => {
                assert_eq!((*line, *column, value.as_str()), (2, 2, "x"))
            }
            other => panic!("{other:?}"),
        }
        assert!(e.to_string().contains("t.csv:2"), "{e}");
        let e = parse("1,2,0\n\n1,2,1\n1,1\n").unwrap_err();
        assert!(matches!(e, DataError::Ragged { line: 4, expected: 3, got: 2, .. }), "{e:?}");
        assert!(matches!(parse("1,2,0\n1,2,-1\n").unwrap_err(), DataError::LabelOutOfRange { line: 2, label: -1, .. }));
        assert!(matches!(parse("1,0\n1,1024\n").unwrap_err(), DataError::LabelOutOfRange { label: 1024, .. }));
        assert_eq!(parse("1,0\n1,1023\n").unwrap().classes, 1024);
        assert!(matches!(parse("1,0\n1,1.5\n").unwrap_err(), DataError::Malformed { line: 2, column: 2, .. }));
        assert_eq!(parse("1,0.0\n1,1.0\n").unwrap().labels, vec![0, 1]);
        assert!(matches!(parse("1,0\ninf,1\n").unwrap_err(), DataError::NonFinite { line: 2, column: 1, .. }));
        assert!(matches!(parse("1,0\n1,NaN,\n").unwrap_err(), DataError::Ragged { .. }));
        assert!(matches!(parse("NaN,0\n1,1\n").unwrap_err(), DataError::NonFinite { line: 1, .. }));
        assert!(matches!(parse("7\n").unwrap_err(), DataError::Malformed { line: 1, column: 0, .. }));
        assert!(matches!(parse("1,0\n2,0\n").unwrap_err(), DataError::TooFewClasses { distinct: 1, .. }));
        let e = Dataset::from_bytes(b"1,0\n\xff,1\n", "u.csv").unwrap_err();
        assert!(matches!(e, DataError::Malformed { line: 2, .. }), "{e:?}");
    }

    #[test]
    fn truncated_gzip_reports_the_line() {
        let text: String = (0..2000).map(|i| format!("{},{},{}\n", i % 7, i % 13, i % 3)).collect();
        let z = gz(text.as_bytes());
        let full = Dataset::from_bytes(&z, "z").unwrap();
        assert_eq!(full.len(), 2000);
        let e = Dataset::from_bytes(&z[..z.len() / 2], "z.gz").unwrap_err();
        match &e {
            DataError::Decompress { line, .. } => assert!(*line > 1, "{e}"),
            other => panic!("expected Decompress, got {other:?}"),
        }
        assert!(e.to_string().contains("truncated"), "{e}");
    }

    #[test]
    fn split_is_deterministic_disjoint_and_complete() {
        let d = Dataset::embedded_digits().unwrap();
        let (tr, ho) = d.split(0.2, 7).unwrap();
        assert_eq!(ho.len(), 359); // round(1797 * 0.2) = 359.4 -> 359
        assert_eq!(tr.len() + ho.len(), d.len());
        assert_eq!(d.split(0.2, 7).unwrap(), (tr.clone(), ho.clone()));
        assert_ne!(d.split(0.2, 8).unwrap().1, ho);
        assert_eq!((tr.dim, tr.classes, ho.classes), (64, 10, 10));
        // Every sample ends up in exactly one part: compare multisets of (row, label).
        let key = |s: &Dataset, i: usize| {
            let mut k: Vec<u32> = s.features[i * 64..(i + 1) * 64].iter().map(|v| v.to_bits()).collect();
            k.push(s.labels[i]);
            k
        };
        let mut all: Vec<_> = (0..d.len()).map(|i| key(&d, i)).collect();
        let mut parts: Vec<_> = (0..tr.len()).map(|i| key(&tr, i)).chain((0..ho.len()).map(|i| key(&ho, i))).collect();
        all.sort();
        parts.sort();
        assert_eq!(all, parts);
        assert_eq!(d.split(0.0, 1).unwrap().1.len(), 0);
        for bad in [1.0, -0.1, f64::NAN, 0.9999] {
            assert!(matches!(d.split(bad, 1), Err(DataError::InvalidSplit { .. })), "{bad}");
        }
    }

    /// The fewest items split into one held-out and one training item, against a scan of
    /// `holdout_split` itself from 1 (and every larger count splits too).
    #[test]
    fn min_split_items_is_the_first_count_holdout_split_splits() {
        for f in [0.2, 0.5, 0.9, 0.01, 0.33, 0.999, 1e-4, 0.75] {
            let splits = |n: usize| holdout_split(n, f, 7).is_ok_and(|(t, h)| !t.is_empty() && !h.is_empty());
            let first = (1..100_000).find(|&n| splits(n)).expect("a count");
            assert_eq!(min_split_items(f), Some(first as u64), "{f}");
            assert!((first..first + 50).all(splits), "{f}");
        }
        assert_eq!(min_split_items(0.2), Some(3));
        for bad in [0.0, 1.0, -0.5, f64::NAN, 1e-300] {
            assert_eq!(min_split_items(bad), None, "{bad}");
        }
    }

    #[test]
    fn rows_gather_and_pad() {
        let d = parse("1,2,0\n3,4,1\n5,6,2\n").unwrap();
        let (x, y) = d.rows(&[2, 0]).unwrap();
        assert_eq!(x, vec![5.0 / 6.0, 1.0, 1.0 / 6.0, 2.0 / 6.0]);
        assert_eq!(y, vec![2, 0]);
        let (x, y) = d.rows_padded(&[1], 3).unwrap();
        assert_eq!(x, vec![0.5, 4.0 / 6.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(y, vec![1, -1, -1]);
        assert!(matches!(d.rows(&[3]), Err(DataError::SampleOutOfRange { id: 3, len: 3 })));
        assert!(matches!(d.rows(&[u64::MAX]), Err(DataError::SampleOutOfRange { .. })));
        assert!(matches!(d.rows_padded(&[0, 1], 1), Err(DataError::BatchOverflow { ids: 2, batch: 1 })));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Arbitrary bytes never panic; a successful parse is internally consistent.
        #[test]
        fn arbitrary_input_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(d) = Dataset::from_bytes(&bytes, "p") {
                prop_assert_eq!(d.features.len(), d.len() * d.dim);
                prop_assert!(d.labels.iter().all(|&l| (l as usize) < d.classes));
            }
        }

        /// Every strict prefix of a gzip file is an error, never a silently shorter data set.
        #[test]
        fn gzip_prefixes_fail(cut in 0.0f64..1.0) {
            let z = gz(b"1,2,0\n3,4,1\n5,6,1\n7,8,0\n");
            let n = ((z.len() as f64) * cut) as usize;
            prop_assert!(Dataset::from_bytes(&z[..n.max(2)], "p.gz").is_err());
        }
    }

    #[test]
    fn crlf_errors_name_the_physical_line() {
        for eol in ["\n", "\r\n"] {
            let text = ["f1,f2,label", "1,2,0", "3,4,1", "5,x,1"].join(eol) + eol;
            match parse(&text) {
                Err(DataError::Malformed { line, column, .. }) => assert_eq!((line, column), (4, 2), "{eol:?}"),
                other => panic!("{eol:?}: expected Malformed, got {other:?}"),
            }
        }
    }

    #[test]
    fn labels_are_checked_against_the_class_count_with_line_and_column() {
        // The fixture: the first 3 rows of the digits, line 2's label set to 10.
        let mut d = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(DIGITS_GZ), &mut d).unwrap();
        let text = String::from_utf8(d).unwrap();
        let mut rows: Vec<String> = text.lines().take(3).map(str::to_string).collect();
        let width = rows[1].split(',').count();
        let cut = rows[1].rfind(',').unwrap();
        rows[1] = format!("{},10", &rows[1][..cut]);
        let tmp = tempfile::Builder::new().prefix("dc-labels-").tempdir().unwrap();
        let dir = tmp.path();
        let f = dir.join("three.csv");
        std::fs::write(&f, rows.join("\n")).unwrap();
        match Dataset::load(&f, 10) {
            Err(DataError::LabelOutOfRange { line, column, label, classes, .. }) => {
                assert_eq!((line, column, label, classes), (2, width, 10, 10));
            }
            other => panic!("expected LabelOutOfRange, got {other:?}"),
        }
        // With 11 classes the same file loads, and the model would have 11 outputs.
        assert_eq!(Dataset::load(&f, 11).unwrap().classes, 11);
        // Negative and non-integer labels are named too.
        std::fs::write(&f, "1,2,0\n3,4,-1\n").unwrap();
        assert!(matches!(Dataset::load(&f, 10), Err(DataError::LabelOutOfRange { line: 2, column: 3, label: -1, .. })));
        std::fs::write(&f, "1,2,0\n3,4,2.5\n").unwrap();
        assert!(matches!(Dataset::load(&f, 10), Err(DataError::Malformed { line: 2, column: 3, .. })));
    }
}
