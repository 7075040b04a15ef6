//! The text job's data: a corpus of categorized documents (the embedded fortune cookies of
//! Debian's `fortunes` package, 15217 of them in 43 topic files; provenance and licence in
//! data/README.md), byte-level tokens, the deterministic train/held-out split, and the *bucket
//! plan*: every document padded to the smallest of a few length buckets that holds it and
//! grouped with documents of its own bucket into fixed micro-batches, so that every micro-batch
//! has one static shape (rows x bucket length: one compiled graph per bucket).
//!
//! Owns: [`Corpus`] and its file format, the token ids ([`CLS`], [`PAD`], [`VOCAB`]),
//! [`Buckets`], [`BucketPlan`] (which documents form micro-batch unit `u`), [`BatchShape`] (a
//! micro-batch's bucket length, real tokens and samples), [`TextBatch`] (the tokens and labels
//! a graph takes), [`TokenCounted`] (the dealt micro-batches with their token counts and buckets) and the
//! length statistics ([`PlanStats`]). Must not touch: how micro-batches are dealt to ranks and
//! re-queued (the one dealer, `dropcompute::deal`: this module only names what a dealt id
//! means), the model, devices, the cost model of a graph (the mock's).
//!
//! # How the bucketed micro-batches ride the one dealer
//! The dealer (`dropcompute::deal::RunData::global`) deals *ids* `0..samples`, shuffled per
//! epoch by (seed, epoch), cut into micro-batches of `micro_batch_size` ids, every rank's
//! not-started tail re-queued at the front in rank order. The plan fixes, once per run, which
//! documents form each micro-batch ([`BucketPlan::new`]: per bucket, its documents shuffled by
//! the seed and cut into units of `micro_batch_size` documents; the last unit of a bucket may
//! be short). The dealer is then given `samples` = [`BucketPlan::units`] and
//! `micro_batch_size` = 1: each dealt id is one unit, so each dealt micro-batch has one bucket,
//! and every property the dealer has for ids (each id started exactly once per epoch under
//! every assignment and every drop, re-queued first) holds for units, hence for documents and
//! their tokens. No second dealer: only the meaning of an id changes. Under a tail shape of
//! split S (`policy::TailShape`), the plan's units are the parts (micro-batch size / S
//! documents each); a whole launch merges S consecutive parts (the scheduler's `merge_parts`,
//! the paired baseline's `EpochSource::merged`), and such a micro-batch may hold units of
//! several buckets: it is padded to the largest ([`BucketPlan::shape`] of several ids). A unit's samples are its documents: the dealer's
//! `MicroBatch::samples` counts units, so a text run weighs by tokens
//! (`schedule::Weighting::Tokens`, the counts [`TokenCounted`] attaches).
//!
//! # Task
//! Byte-level language modelling (next byte, loss per real token on held-out documents): every
//! real token is a target, so the loss and the gradient are sums over real tokens and the
//! divisor counts tokens (issue 26 item 4). Each document also carries its topic (the fortune
//! file it comes from, [`Document::category`]) for a classification task.
//!
//! # File format (JSON Lines, optionally gzip)
//! One document per line: `{"category":C,"index":I,"text":T}`, no other field: `category`
//! the topic (a fortune file's name), `index` the document's position within it, `text` the
//! document (UTF-8, at most [`MAX_TEXT_BYTES`] bytes). At most [`MAX_CATEGORIES`] distinct
//! categories. Blank lines are skipped. Gzip is detected from the magic bytes `1f 8b`. Every
//! line is read through a cap ([`dropcompute::input::DEFAULT_LINE_CAP`] for content in memory, the data
//! kind's caps of `dropcompute::input` for a file), the whole decoded content through the data
//! kind's size cap, and at most [`MAX_DOCUMENTS`] documents are kept: no input can make the
//! parser buffer without bound.
//!
//! # Tokens
//! A document's tokens are [`CLS`] then its text's bytes (ids 0..=255), truncated to the
//! largest bucket (the first `max_len - 1` bytes kept, the rest of a longer document is not
//! seen), then [`PAD`] up to its bucket's length. Its *real* token count includes the CLS token.
#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde::Deserialize;

use dropcompute::schedule::{DataSource, MicroBatch};
use dropcompute::sim::policies::PartShape;
use dropcompute::sim::rng::StableRng;

use super::data::{DataError, holdout_split};

/// Token id of padding (after the 256 byte values).
pub const PAD: i32 = 256;
/// Token id of the classification token that starts every document.
pub const CLS: i32 = 257;
/// Vocabulary size: 256 byte values, [`PAD`], [`CLS`].
pub const VOCAB: usize = 258;
/// The default buckets (tokens): 64, 128, 256, 512.
pub const DEFAULT_BUCKETS: [u32; 4] = [64, 128, 256, 512];
/// The longest bucket accepted, in tokens (a graph of b x L x L attention scores; bounds the
/// memory a configuration can ask for).
pub const MAX_BUCKET_LEN: u32 = 8192;
/// At most this many buckets (each is one compiled graph).
pub const MAX_BUCKETS: usize = 16;
/// The longest text of one document, bytes.
pub const MAX_TEXT_BYTES: usize = 64 << 10;
/// At most this many documents in one corpus.
pub const MAX_DOCUMENTS: usize = 1 << 20;
/// The most documents in one micro-batch unit (`BucketPlan::new`'s `micro_batch_size`).
pub const MAX_MICRO_BATCH_SIZE: u32 = 1 << 16;

/// The most distinct categories of one corpus.
pub const MAX_CATEGORIES: usize = 1024;

/// The embedded corpus (data/README.md: every fortune of Debian's `fortunes` 1:1.99.1-7.3).
const FORTUNES_GZ: &[u8] = include_bytes!("../../data/fortunes.jsonl.gz");
/// Source name of the embedded corpus in errors.
const FORTUNES_NAME: &str = "<embedded data/fortunes.jsonl.gz>";

/// Why a corpus could not be read, split, planned or gathered. Lines are 1-based.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TextError {
    /// The bounded reader refused the file (`dropcompute::input`, kind data: absent, a
    /// directory, a size or line cap, a stop signal while waiting for a FIFO).
    #[error("{0}")]
    Input(#[from] dropcompute::input::InputError),
    /// Reading failed.
    #[error("text {path}: {source}")]
    Io {
        /// The source.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The gzip stream ended early or is corrupt (e.g. a truncated file).
    #[error("text {path}: gzip stream truncated or corrupt while reading line {line}: {source}")]
    Decompress {
        /// The source.
        path: PathBuf,
        /// The line being read.
        line: u64,
        /// The decoder's error.
        #[source]
        source: std::io::Error,
    },
    /// A line longer than the line cap (content held in memory).
    #[error("text {path}:{line}: a line longer than {cap} bytes")]
    LineTooLong {
        /// The source.
        path: PathBuf,
        /// The line.
        line: u64,
        /// The cap, bytes.
        cap: u64,
    },
    /// The decoded content is larger than the data kind's size cap (content held in memory).
    #[error("text {path}: more than {cap} bytes decoded")]
    TooLarge {
        /// The source.
        path: PathBuf,
        /// The cap, bytes.
        cap: u64,
    },
    /// A line is not a record of the format (not JSON, a missing or unknown field, a value of
    /// the wrong type, invalid UTF-8).
    #[error("text {path}:{line}: column {column}: {reason}")]
    Malformed {
        /// The source.
        path: PathBuf,
        /// The line.
        line: u64,
        /// The 1-based column the JSON parser stopped at (0: the whole line).
        column: usize,
        /// What is wrong.
        reason: String,
    },
    /// A document longer than [`MAX_TEXT_BYTES`].
    #[error("text {path}:{line}: a document of {bytes} bytes (at most {MAX_TEXT_BYTES})")]
    TextTooLong {
        /// The source.
        path: PathBuf,
        /// The line.
        line: u64,
        /// Its length, bytes.
        bytes: usize,
    },
    /// More than [`MAX_CATEGORIES`] distinct categories.
    #[error("text {path}:{line}: more than {MAX_CATEGORIES} categories")]
    TooManyCategories {
        /// The source.
        path: PathBuf,
        /// The line of the first one too many.
        line: u64,
    },
    /// More than [`MAX_DOCUMENTS`] documents.
    #[error("text {path}: more than {cap} documents")]
    TooManyDocuments {
        /// The source.
        path: PathBuf,
        /// The cap.
        cap: usize,
    },
    /// No document.
    #[error("text {path}: no document")]
    Empty {
        /// The source.
        path: PathBuf,
    },
    /// The holdout fraction ([`super::data::holdout_split`]).
    #[error(transparent)]
    Split(#[from] DataError),
    /// Bucket lengths that are empty, not strictly ascending, below 2 tokens (CLS and one
    /// byte) or above [`MAX_BUCKET_LEN`], or more than [`MAX_BUCKETS`] of them.
    #[error("buckets {lengths:?}: {why}")]
    Buckets {
        /// The lengths given (tokens).
        lengths: Vec<u32>,
        /// The rule broken.
        why: &'static str,
    },
    /// A micro-batch size of 0 or above [`MAX_MICRO_BATCH_SIZE`].
    #[error("micro-batch size {value}: must be in 1..={MAX_MICRO_BATCH_SIZE} documents")]
    MicroBatchSize {
        /// The value given.
        value: u32,
    },
    /// A dealt id is not a unit of the plan.
    #[error("micro-batch unit {id} out of range (the plan has {units} units)")]
    UnitOutOfRange {
        /// The id.
        id: u64,
        /// Units in the plan.
        units: usize,
    },
    /// A micro-batch with no unit.
    #[error("a micro-batch with no unit id")]
    EmptyMicroBatch,
    /// [`BucketPlan::gather`] was given another corpus than the plan's.
    #[error("the plan was made for {plan} documents, the corpus has {corpus}")]
    PlanMismatch {
        /// Documents of the plan's corpus.
        plan: usize,
        /// Documents of the corpus given.
        corpus: usize,
    },
}

/// One document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Document {
    /// Its topic: an index into [`Corpus::categories`] (the class of a classification task).
    pub category: u16,
    /// Its position within its category in the file (with the category, unique per corpus in
    /// the embedded one).
    pub index: u32,
    /// The text, UTF-8 bytes.
    pub text: Vec<u8>,
}

impl Document {
    /// Real tokens of this document under a largest bucket of `max_len` tokens: CLS plus its
    /// bytes, at most `max_len`.
    pub fn tokens(&self, max_len: u32) -> u32 {
        let n = u32::try_from(self.text.len()).unwrap_or(u32::MAX).saturating_add(1);
        n.min(max_len)
    }
}

/// The on-disk record (module doc).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    category: String,
    index: u32,
    text: String,
}

/// A corpus of categorized documents held in host memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corpus {
    /// Category names in order of first appearance in the file (a document's
    /// [`Document::category`] indexes this).
    pub categories: Vec<String>,
    /// The documents, in file order.
    pub docs: Vec<Document>,
}

impl Corpus {
    /// The embedded fortunes (data/README.md): 15217 documents, 43 categories.
    ///
    /// # Errors
    /// None in practice (the embedded file is valid); as [`Corpus::from_bytes`].
    pub fn embedded() -> Result<Self, TextError> {
        Self::from_bytes(FORTUNES_GZ, FORTUNES_NAME)
    }

    /// Reads a JSON Lines file, optionally gzip (module doc), through the bounded reader of
    /// the data kind (`dropcompute::input`).
    ///
    /// # Errors
    /// [`TextError::Input`] when the reader refuses the file or a cap is passed; otherwise as
    /// [`Corpus::from_bytes`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self, TextError> {
        let path = path.as_ref();
        let input = dropcompute::input::open(path, dropcompute::input::InputKind::Data)?;
        let gzip = input.is_gzip();
        // The reader enforces the data kind's caps itself; these are the outer bounds.
        parse(BufReader::new(input), gzip, path, u64::MAX, u64::MAX)
    }

    /// Parses JSON Lines content held in memory, gunzipped when it starts with the gzip
    /// magic; `source` names it in errors.
    ///
    /// # Errors
    /// [`TextError::Decompress`], [`TextError::LineTooLong`], [`TextError::TooLarge`],
    /// [`TextError::Malformed`], [`TextError::TextTooLong`], [`TextError::TooManyCategories`],
    /// [`TextError::TooManyDocuments`], [`TextError::Empty`] (each naming `source`, and the
    /// 1-based line where there is one).
    pub fn from_bytes(bytes: &[u8], source: impl AsRef<Path>) -> Result<Self, TextError> {
        let path = source.as_ref();
        let gzip = bytes.starts_with(&[0x1f, 0x8b]);
        let cap = dropcompute::input::InputKind::Data.default_cap();
        let line_cap = dropcompute::input::DEFAULT_LINE_CAP;
        if gzip {
            parse(BufReader::new(flate2::read::MultiGzDecoder::new(bytes)), true, path, cap, line_cap)
        } else {
            parse(bytes, false, path, cap, line_cap)
        }
    }

    /// Number of documents.
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    /// True when there is no document.
    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    /// Documents of each category, in [`Corpus::categories`]' order.
    pub fn category_counts(&self) -> Vec<usize> {
        let mut n = vec![0; self.categories.len()];
        self.docs.iter().for_each(|d| n[usize::from(d.category)] += 1);
        n
    }

    /// Splits into `(train, holdout)` by the one rule of `train`
    /// ([`super::data::holdout_split`]): `round(len * holdout_fraction)` documents chosen
    /// uniformly at random by `seed`, both parts in file order with this corpus' categories.
    /// Deterministic.
    ///
    /// # Errors
    /// [`TextError::Split`] when the fraction is not in [0, 1) or leaves train empty.
    pub fn split(&self, holdout_fraction: f64, seed: u64) -> Result<(Corpus, Corpus), TextError> {
        let (train, hold) = holdout_split(self.len(), holdout_fraction, seed)?;
        let pick = |ids: &[usize]| Corpus {
            categories: self.categories.clone(),
            docs: ids.iter().map(|&i| self.docs[i].clone()).collect(),
        };
        Ok((pick(&train), pick(&hold)))
    }
}

/// Reads records line by line from decoded content: at most `line_cap` bytes a line and
/// `cap` bytes in all (`u64::MAX`: the reader enforces its own).
fn parse(mut input: impl BufRead, gzip: bool, path: &Path, cap: u64, line_cap: u64) -> Result<Corpus, TextError> {
    let mut docs = Vec::new();
    let mut categories: Vec<String> = Vec::new();
    let mut index_of = std::collections::HashMap::<String, u16>::new();
    let mut buf = Vec::new();
    let (mut line, mut total) = (0u64, 0u64);
    let at = || path.to_path_buf();
    loop {
        buf.clear();
        let n = (&mut input).take(line_cap.saturating_add(1)).read_until(b'\n', &mut buf).map_err(|e| {
            match dropcompute::input::InputError::from_io(e) {
                Ok(refused) => TextError::Input(refused),
                Err(source) if gzip => TextError::Decompress { path: at(), line: line + 1, source },
                Err(source) => TextError::Io { path: at(), source },
            }
        })?;
        if n == 0 {
            break;
        }
        line += 1;
        total = total.saturating_add(n as u64);
        if total > cap {
            return Err(TextError::TooLarge { path: at(), cap });
        }
        if n as u64 > line_cap && buf.last() != Some(&b'\n') {
            return Err(TextError::LineTooLong { path: at(), line, cap: line_cap });
        }
        let body = buf.trim_ascii();
        if body.is_empty() {
            continue;
        }
        // `["g", 1, "a"]` would be read into the record's fields in order (serde's sequence form).
        if let Err(why) = habana_sys::require_json_object(body) {
            return Err(TextError::Malformed { path: at(), line, column: 1, reason: why.to_owned() });
        }
        let rec: Record = serde_json::from_slice(body).map_err(|e| TextError::Malformed {
            path: at(),
            line,
            column: e.column(),
            reason: e.to_string(),
        })?;
        if rec.text.len() > MAX_TEXT_BYTES {
            return Err(TextError::TextTooLong { path: at(), line, bytes: rec.text.len() });
        }
        if docs.len() == MAX_DOCUMENTS {
            return Err(TextError::TooManyDocuments { path: at(), cap: MAX_DOCUMENTS });
        }
        let category = match index_of.get(&rec.category) {
            Some(&c) => c,
            None if categories.len() == MAX_CATEGORIES => {
                return Err(TextError::TooManyCategories { path: at(), line });
            }
            None => {
                // MAX_CATEGORIES <= u16::MAX.
                let c = categories.len() as u16;
                index_of.insert(rec.category.clone(), c);
                categories.push(rec.category);
                c
            }
        };
        docs.push(Document { category, index: rec.index, text: rec.text.into_bytes() });
    }
    if docs.is_empty() {
        return Err(TextError::Empty { path: at() });
    }
    Ok(Corpus { categories, docs })
}

/// The length buckets, tokens: strictly ascending, each in 2..=[`MAX_BUCKET_LEN`], at most
/// [`MAX_BUCKETS`]. A document goes to the smallest bucket that holds it; one longer than the
/// largest is truncated to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Buckets {
    lengths: Vec<u32>,
}

impl Default for Buckets {
    /// [`DEFAULT_BUCKETS`].
    fn default() -> Self {
        Self { lengths: DEFAULT_BUCKETS.to_vec() }
    }
}

impl Buckets {
    /// Checked bucket lengths (tokens).
    ///
    /// # Errors
    /// [`TextError::Buckets`] naming the rule broken.
    pub fn new(lengths: Vec<u32>) -> Result<Self, TextError> {
        let why = if lengths.is_empty() {
            Some("no bucket")
        } else if lengths.len() > MAX_BUCKETS {
            Some("more than 16 buckets")
        } else if lengths.windows(2).any(|w| w[0] >= w[1]) {
            Some("lengths must be strictly ascending")
        } else if lengths[0] < 2 {
            Some("the smallest bucket must hold CLS and one byte (>= 2 tokens)")
        } else if lengths[lengths.len() - 1] > MAX_BUCKET_LEN {
            Some("the largest bucket must be at most 8192 tokens")
        } else {
            None
        };
        match why {
            Some(why) => Err(TextError::Buckets { lengths, why }),
            None => Ok(Self { lengths }),
        }
    }

    /// The lengths, ascending (tokens).
    pub fn lengths(&self) -> &[u32] {
        &self.lengths
    }

    /// The largest bucket's length: documents are truncated to it (tokens).
    pub fn max_len(&self) -> u32 {
        self.lengths[self.lengths.len() - 1]
    }

    /// Index of the smallest bucket holding `tokens` (the largest when none does).
    pub fn index_of(&self, tokens: u32) -> usize {
        self.lengths.partition_point(|&l| l < tokens).min(self.lengths.len() - 1)
    }
}

/// One micro-batch unit of a [`BucketPlan`]: documents of one bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    /// Its bucket (index into [`Buckets::lengths`]).
    pub bucket: usize,
    /// Its documents (indices into the plan's corpus), 1..=micro-batch size of them.
    pub docs: Vec<u32>,
    /// Their real tokens (CLS included, after truncation).
    pub tokens: u64,
}

/// What one micro-batch is, as its graph sees it and the scheduler counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchShape {
    /// Its bucket (index into [`Buckets::lengths`]): the largest of its units'.
    pub bucket: usize,
    /// The bucket's length: tokens per row (the graph's sequence length).
    pub len: u32,
    /// Rows of the graph: units x the plan's micro-batch size (padding rows included).
    pub rows: u32,
    /// Documents in it (non-padding rows).
    pub samples: u32,
    /// Real (non-padding) tokens, CLS included.
    pub tokens: u64,
}

impl BatchShape {
    /// Padding tokens: `rows * len - tokens` (padding rows and the padded tail of each row).
    pub fn padding(&self) -> u64 {
        u64::from(self.rows) * u64::from(self.len) - self.tokens
    }
}

/// A gathered micro-batch: what the bucket's graph takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextBatch {
    /// Shape and counts.
    pub shape: BatchShape,
    /// `rows x len` token ids, row-major: CLS, bytes, then [`PAD`]; a padding row is all PAD.
    pub tokens: Vec<i32>,
    /// `rows` labels (each document's [`Document::category`]); -1 for a padding row.
    pub labels: Vec<i32>,
}

/// Which documents form each micro-batch unit of a run (module doc): units are what the dealer
/// deals (`dropcompute::deal::RunData::global(plan.units(), seed, 1, 1, epochs)`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketPlan {
    buckets: Buckets,
    micro_batch_size: u32,
    /// Real tokens of every document of the corpus (after truncation).
    doc_tokens: Vec<u32>,
    units: Vec<Unit>,
}

impl BucketPlan {
    /// The plan over `corpus`: each document in the smallest bucket that holds its tokens
    /// (truncated to the largest); per bucket (ascending), its documents shuffled with
    /// [`StableRng`]`::seed_from_u64(seed)` (one generator, bucket after bucket) and cut into
    /// units of `micro_batch_size` documents, the last one of a bucket possibly short. Unit ids
    /// run bucket after bucket.
    ///
    /// # Errors
    /// [`TextError::MicroBatchSize`] outside 1..=[`MAX_MICRO_BATCH_SIZE`].
    pub fn new(corpus: &Corpus, buckets: Buckets, micro_batch_size: u32, seed: u64) -> Result<Self, TextError> {
        if !(1..=MAX_MICRO_BATCH_SIZE).contains(&micro_batch_size) {
            return Err(TextError::MicroBatchSize { value: micro_batch_size });
        }
        let doc_tokens: Vec<u32> = corpus.docs.iter().map(|d| d.tokens(buckets.max_len())).collect();
        let mut per_bucket: Vec<Vec<u32>> = vec![Vec::new(); buckets.lengths().len()];
        for (i, &t) in doc_tokens.iter().enumerate() {
            // MAX_DOCUMENTS < u32::MAX.
            per_bucket[buckets.index_of(t)].push(i as u32);
        }
        let mut rng = StableRng::seed_from_u64(seed);
        let mut units = Vec::new();
        for (bucket, mut docs) in per_bucket.into_iter().enumerate() {
            docs.shuffle(&mut rng);
            for chunk in docs.chunks(micro_batch_size as usize) {
                let tokens = chunk.iter().map(|&d| u64::from(doc_tokens[d as usize])).sum();
                units.push(Unit { bucket, docs: chunk.to_vec(), tokens });
            }
        }
        Ok(Self { buckets, micro_batch_size, doc_tokens, units })
    }

    /// Units of the plan: the dealer's `samples` (one id per unit).
    pub fn units(&self) -> u64 {
        self.units.len() as u64
    }

    /// Unit `id`.
    ///
    /// # Errors
    /// [`TextError::UnitOutOfRange`].
    pub fn unit(&self, id: u64) -> Result<&Unit, TextError> {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.units.get(i))
            .ok_or(TextError::UnitOutOfRange { id, units: self.units.len() })
    }

    /// The buckets.
    pub fn buckets(&self) -> &Buckets {
        &self.buckets
    }

    /// Documents per unit (the rows of one unit's graph).
    pub fn micro_batch_size(&self) -> u32 {
        self.micro_batch_size
    }

    /// Real tokens of document `doc` of the plan's corpus (CLS included, truncated).
    pub fn doc_tokens(&self) -> &[u32] {
        &self.doc_tokens
    }

    /// The shape of the micro-batch of units `ids` (one id for a whole micro-batch; S parts
    /// merged under a tail shape): the largest bucket of its units, rows = `ids.len()` x the
    /// micro-batch size, its documents and real tokens.
    ///
    /// # Errors
    /// [`TextError::EmptyMicroBatch`], [`TextError::UnitOutOfRange`].
    pub fn shape(&self, ids: &[u64]) -> Result<BatchShape, TextError> {
        let units = ids.iter().map(|&id| self.unit(id)).collect::<Result<Vec<_>, _>>()?;
        let samples = units.iter().map(|u| u.docs.len() as u32).sum();
        // The one bucket-merge rule (`PartShape::merged`): the largest bucket, the tokens' sum.
        let merged = PartShape::merged(
            units.iter().map(|u| PartShape { bucket: u32::try_from(u.bucket).unwrap_or(u32::MAX), tokens: u.tokens }),
        )
        .ok_or(TextError::EmptyMicroBatch)?;
        let (bucket, tokens) = (merged.bucket as usize, merged.tokens);
        let rows = u32::try_from(ids.len()).unwrap_or(u32::MAX).saturating_mul(self.micro_batch_size);
        Ok(BatchShape { bucket, len: self.buckets.lengths()[bucket], rows, samples, tokens })
    }

    /// Every unit's bucket and real tokens by unit id ([`BucketPlan::shape`] of that one id):
    /// the table the prediction's stream deals with (`dropcompute::deal::ReplayStream::with_shapes`),
    /// so the replay knows each dealt part as the run's [`BucketPlan::count_tokens`] does.
    pub fn part_shapes(&self) -> Arc<[PartShape]> {
        // Every id below `units()` is the plan's: `shape` cannot fail (an unknown id would have
        // no entry, and the stream no shape for it).
        (0..self.units())
            .map_while(|id| self.shape(&[id]).ok())
            .map(|s| PartShape { bucket: u32::try_from(s.bucket).unwrap_or(u32::MAX), tokens: s.tokens })
            .collect()
    }

    /// Sets `mb.tokens` to its real tokens and `mb.bucket` to its bucket
    /// ([`BucketPlan::shape`]): what the scheduler's length-aware policies and token
    /// normalization read before the launch.
    ///
    /// # Errors
    /// As [`BucketPlan::shape`]; `mb` is then left as it was.
    pub fn count_tokens(&self, mb: &mut MicroBatch) -> Result<BatchShape, TextError> {
        let shape = self.shape(&mb.sample_ids)?;
        mb.tokens = Some(shape.tokens);
        mb.bucket = u32::try_from(shape.bucket).ok();
        Ok(shape)
    }

    /// The tokens and labels of the micro-batch of units `ids` from `corpus` (the plan's own).
    ///
    /// # Errors
    /// [`TextError::PlanMismatch`] when `corpus` is not the plan's (another document count or
    /// another length); as [`BucketPlan::shape`].
    pub fn gather(&self, corpus: &Corpus, ids: &[u64]) -> Result<TextBatch, TextError> {
        let mismatch = || TextError::PlanMismatch { plan: self.doc_tokens.len(), corpus: corpus.len() };
        if corpus.len() != self.doc_tokens.len() {
            return Err(mismatch());
        }
        let shape = self.shape(ids)?;
        let len = shape.len as usize;
        let mut tokens = vec![PAD; shape.rows as usize * len];
        let mut labels = vec![-1; shape.rows as usize];
        let docs = ids.iter().flat_map(|&id| self.units[id as usize].docs.iter().copied());
        for (row, d) in docs.enumerate() {
            let doc = &corpus.docs[d as usize];
            let n = self.doc_tokens[d as usize] as usize;
            if doc.tokens(self.buckets.max_len()) as usize != n {
                return Err(mismatch());
            }
            let out = &mut tokens[row * len..row * len + n];
            out[0] = CLS;
            for (o, &b) in out[1..].iter_mut().zip(&doc.text) {
                *o = i32::from(b);
            }
            labels[row] = i32::from(doc.category);
        }
        Ok(TextBatch { shape, tokens, labels })
    }

    /// Length and bucket statistics of the plan (every number of data/README.md's table).
    pub fn stats(&self, corpus: &Corpus) -> PlanStats {
        let mut sorted: Vec<u64> = corpus.docs.iter().map(|d| d.text.len() as u64 + 1).collect();
        sorted.sort_unstable();
        let max = self.buckets.max_len();
        let buckets = self
            .buckets
            .lengths()
            .iter()
            .enumerate()
            .map(|(b, &len)| {
                let units: Vec<&Unit> = self.units.iter().filter(|u| u.bucket == b).collect();
                BucketRow {
                    len,
                    documents: units.iter().map(|u| u.docs.len() as u64).sum(),
                    micro_batches: units.len() as u64,
                    tokens: units.iter().map(|u| u.tokens).sum(),
                    padded_tokens: units.len() as u64 * u64::from(self.micro_batch_size) * u64::from(len),
                }
            })
            .collect();
        PlanStats {
            documents: corpus.len() as u64,
            quantiles: QUANTILES.iter().map(|&q| (q, nearest_rank(&sorted, q))).collect(),
            mean_tokens: sorted.iter().sum::<u64>() as f64 / sorted.len().max(1) as f64,
            truncated: sorted.iter().filter(|&&t| t > u64::from(max)).count() as u64,
            buckets,
        }
    }

    /// Spread of micro-batch cost over the plan's units under cost = Σ over rows of
    /// `len^exponent` (exponent 2: attention scores, b·L² per micro-batch; 1: the linear
    /// layers). `padded`: every row of the unit's graph at its bucket length (what the static
    /// graph computes); `real`: each document at its own token count (what an unpadded kernel
    /// would compute). The ratios are NaN for a plan without units.
    pub fn cost_spread(&self, exponent: i32) -> CostSpread {
        let b = f64::from(self.micro_batch_size);
        let padded: Vec<f64> =
            self.units.iter().map(|u| b * f64::from(self.buckets.lengths()[u.bucket]).powi(exponent)).collect();
        let real: Vec<f64> = self
            .units
            .iter()
            .map(|u| u.docs.iter().map(|&d| f64::from(self.doc_tokens[d as usize]).powi(exponent)).sum())
            .collect();
        let (mean, var) = mean_var(&padded);
        let (real_mean, real_var) = mean_var(&real);
        // Between-bucket variance of the real cost: each unit replaced by its bucket's mean.
        let mut sums = vec![(0.0f64, 0usize); self.buckets.lengths().len()];
        for (u, &c) in self.units.iter().zip(&real) {
            sums[u.bucket].0 += c;
            sums[u.bucket].1 += 1;
        }
        let fitted: Vec<f64> = self.units.iter().map(|u| sums[u.bucket].0 / sums[u.bucket].1 as f64).collect();
        let (_, between) = mean_var(&fitted);
        CostSpread {
            exponent,
            mean,
            cv: var.sqrt() / mean,
            max_over_mean: padded.iter().copied().fold(0.0, f64::max) / mean,
            real_mean,
            real_cv: real_var.sqrt() / real_mean,
            explained_by_bucket: if real_var > 0.0 { between / real_var } else { 1.0 },
            pad_to_max_ratio: b * f64::from(self.buckets.max_len()).powi(exponent) / mean,
        }
    }
}

/// Population mean and variance (f64).
fn mean_var(v: &[f64]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    (mean, v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n)
}

/// The quantiles [`PlanStats`] reports.
pub const QUANTILES: [f64; 8] = [0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0];

/// The nearest-rank quantile of ascending `sorted`: the value at rank ceil(q·n) (1-based;
/// q = 0 gives the smallest); 0 for an empty slice.
pub fn nearest_rank(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Length statistics of a corpus under a plan ([`BucketPlan::stats`]).
#[derive(Clone, Debug, PartialEq)]
pub struct PlanStats {
    /// Documents.
    pub documents: u64,
    /// (q, tokens) for each of [`QUANTILES`]: document length in tokens (CLS + bytes) before
    /// truncation to the largest bucket, nearest rank.
    pub quantiles: Vec<(f64, u64)>,
    /// Mean length before truncation, tokens.
    pub mean_tokens: f64,
    /// Documents longer than the largest bucket (truncated).
    pub truncated: u64,
    /// One row per bucket, ascending.
    pub buckets: Vec<BucketRow>,
}

/// One bucket's share of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketRow {
    /// Its length, tokens.
    pub len: u32,
    /// Documents in it.
    pub documents: u64,
    /// Micro-batch units of it.
    pub micro_batches: u64,
    /// Real tokens (CLS included).
    pub tokens: u64,
    /// Tokens its graphs compute: micro-batches x micro-batch size x length.
    pub padded_tokens: u64,
}

/// [`BucketPlan::cost_spread`]'s numbers (cost in units of token^exponent).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostSpread {
    /// The exponent of the cost model.
    pub exponent: i32,
    /// Mean padded micro-batch cost.
    pub mean: f64,
    /// Coefficient of variation (std / mean) of the padded cost.
    pub cv: f64,
    /// Largest padded cost over the mean.
    pub max_over_mean: f64,
    /// Mean real (unpadded) cost.
    pub real_mean: f64,
    /// Coefficient of variation of the real cost.
    pub real_cv: f64,
    /// Fraction of the real cost's variance that the bucket explains (between-bucket
    /// variance over total, η²); the padded cost is the bucket's alone (fraction 1).
    pub explained_by_bucket: f64,
    /// Cost of a micro-batch padded to the largest bucket over the mean padded cost (what the
    /// buckets save against one shape).
    pub pad_to_max_ratio: f64,
}

/// A data source whose micro-batches carry their real token counts and buckets
/// ([`BucketPlan::count_tokens`]): the dealt micro-batches of `inner` (the one dealer over the
/// plan's units) with `tokens` and `bucket` set, for `schedule::Weighting::Tokens` and the
/// scheduler's length-aware policies. Dealing (by counts, or the cost-balanced deal, which sees
/// the parts counted), re-queueing and settling are `inner`'s, unchanged. A micro-batch whose ids are not the plan's keeps
/// `tokens: None`, which the scheduler refuses under token weighting (`ScheduleError::Data`).
#[derive(Clone, Debug)]
pub struct TokenCounted<S> {
    /// The plan whose units `inner` deals.
    pub plan: Arc<BucketPlan>,
    /// The dealer.
    pub inner: S,
}

impl<S> TokenCounted<S> {
    fn counted(&self, mb: MicroBatch) -> MicroBatch {
        counted_by(&self.plan, mb)
    }
}

/// `mb` with its tokens and bucket from `plan` ([`BucketPlan::count_tokens`]); neither when
/// its ids are not the plan's.
fn counted_by(plan: &BucketPlan, mut mb: MicroBatch) -> MicroBatch {
    if plan.count_tokens(&mut mb).is_err() {
        mb.tokens = None;
        mb.bucket = None;
    }
    mb
}

impl<S: DataSource> DataSource for TokenCounted<S> {
    fn next_micro_batch(&mut self) -> Option<MicroBatch> {
        let mb = self.inner.next_micro_batch()?;
        Some(self.counted(mb))
    }

    fn requeue(&mut self, dropped: Vec<MicroBatch>) {
        self.inner.requeue(dropped);
    }

    fn take_assigned(&mut self, rank: u32, assignment: &[u32]) -> Vec<MicroBatch> {
        self.inner.take_assigned(rank, assignment).into_iter().map(|mb| self.counted(mb)).collect()
    }

    fn settle(&mut self, rank: u32, computed: &[u32], dropped: Vec<MicroBatch>, requeue: bool) {
        self.inner.settle(rank, computed, dropped, requeue);
    }

    /// `inner`'s deal, `deal` seeing the parts counted (tokens and buckets: the cost-balanced
    /// deal needs the buckets).
    fn take_dealt(
        &mut self,
        rank: u32,
        parts: usize,
        deal: &mut dyn FnMut(&[MicroBatch]) -> Vec<Vec<usize>>,
    ) -> Option<Vec<Vec<MicroBatch>>> {
        let plan = Arc::clone(&self.plan);
        let mut counted_deal = |raw: &[MicroBatch]| {
            let c: Vec<MicroBatch> = raw.iter().map(|mb| counted_by(&plan, mb.clone())).collect();
            deal(&c)
        };
        let slices = self.inner.take_dealt(rank, parts, &mut counted_deal)?;
        Some(slices.into_iter().map(|s| s.into_iter().map(|mb| self.counted(mb)).collect()).collect())
    }
}

#[cfg(test)]
#[path = "text_tests.rs"]
mod tests;
