//! Tests of `train::text`: parsing (every refusal typed, a truncated gzip refused), the
//! deterministic split, bucket assignment and padding counted exactly (property tests against
//! a direct recount), the length distribution of the embedded corpus, and every token of an
//! epoch started exactly once when the plan's units are dealt by the one dealer, under
//! arbitrary assignments and drops and under every step policy of the replay.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use proptest::prelude::*;

use dropcompute::deal::RunData;
use dropcompute::policy::{CheckMode, Policy, StepPolicy, Threshold};
use dropcompute::sim::policies::{ExecutionModel, PolicyRun, ReplayData, replay_policy_on};
use dropcompute::trace::LatencyTrace;

use super::*;

fn gz(text: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(text).unwrap();
    e.finish().unwrap()
}

/// One record line of the format.
fn rec(category: &str, index: u32, text: &str) -> String {
    serde_json::json!({"category": category, "index": index, "text": text}).to_string()
}

/// A corpus of documents with the given lengths (bytes), categories alternating.
fn corpus_of(lengths: &[usize]) -> Corpus {
    let docs = lengths
        .iter()
        .enumerate()
        .map(|(i, &n)| Document {
            category: (i % 2) as u16,
            index: i as u32,
            text: (0..n).map(|k| b'a' + ((i + k) % 26) as u8).collect(),
        })
        .collect();
    Corpus { categories: vec!["even".into(), "odd".into()], docs }
}

fn parse_str(text: &str) -> Result<Corpus, TextError> {
    Corpus::from_bytes(text.as_bytes(), "t.jsonl")
}

#[test]
fn records_parse_with_blank_lines_crlf_and_gzip() {
    let text = format!("{}\r\n\n{}\n{}", rec("art", 0, "hello"), rec("food", 0, "CAFÉ NOW"), rec("art", 1, ""));
    let c = parse_str(&text).unwrap();
    assert_eq!(c.len(), 3);
    assert_eq!(c.categories, vec!["art".to_string(), "food".to_string()]);
    assert_eq!(c.category_counts(), vec![2, 1]);
    assert_eq!(c.docs[1].text, "CAFÉ NOW".as_bytes());
    assert_eq!((c.docs[1].category, c.docs[1].index, c.docs[2].category, c.docs[2].index), (1, 0, 0, 1));
    // Tokens: CLS + bytes ("É" is 2 bytes), capped by the largest bucket.
    assert_eq!(c.docs[1].tokens(512), 10);
    assert_eq!(c.docs[1].tokens(4), 4);
    assert_eq!(c.docs[2].tokens(512), 1);
    assert_eq!(Corpus::from_bytes(&gz(text.as_bytes()), "t.gz").unwrap(), c);
}

/// Every refusal of a record, table-driven: the variant and the line it names.
#[test]
fn bad_records_are_refused_with_the_line() {
    let ok = rec("art", 0, "a");
    let long = rec("art", 1, &"x".repeat(MAX_TEXT_BYTES + 1));
    let cases: Vec<(String, &str, u64)> = vec![
        (format!("{ok}\n{{not json\n{ok}"), "Malformed", 2),
        (format!("{ok}\n{ok}\n{}", r#"{"category":"g","index":"1","text":"a"}"#), "Malformed", 3),
        (format!("{ok}\n{}", r#"{"category":"g","index":1,"text":"a","x":0}"#), "Malformed", 2),
        (format!("{ok}\n{}", r#"{"category":"g","text":"a"}"#), "Malformed", 2),
        (format!("{ok}\n{}", r#"{"category":"g","index":-1,"text":"a"}"#), "Malformed", 2),
        (format!("{ok}\n{}", r#"[1,2]"#), "Malformed", 2),
        // A record as an array, its fields in order: serde read it as a record.
        (format!("{ok}\n{}", r#"["g",1,"a"]"#), "Malformed", 2),
        (format!("{ok}\n{long}"), "TextTooLong", 2),
        ("\n \n".to_string(), "Empty", 0),
        (String::new(), "Empty", 0),
    ];
    for (text, want, line) in cases {
        let e = parse_str(&text).unwrap_err();
        let (got, at) = match &e {
            TextError::Malformed { line, .. } => ("Malformed", *line),
            TextError::TextTooLong { line, .. } => ("TextTooLong", *line),
            TextError::Empty { .. } => ("Empty", 0),
            other => panic!("{text:?}: {other:?}"),
        };
        assert_eq!((got, at), (want, line), "{text:?}: {e}");
        assert!(e.to_string().contains("t.jsonl"), "{e}");
    }
    // Invalid UTF-8 inside a string is refused, never read lossily.
    let mut bytes = format!("{ok}\n").into_bytes();
    bytes.extend_from_slice(b"{\"category\":\"g\",\"index\":1,\"text\":\"\xff\"}\n");
    assert!(matches!(Corpus::from_bytes(&bytes, "u"), Err(TextError::Malformed { line: 2, .. })));
    // One category too many.
    let many: String = (0..=MAX_CATEGORIES).map(|i| rec(&format!("c{i}"), 0, "a") + "\n").collect();
    let e = parse_str(&many).unwrap_err();
    assert!(matches!(e, TextError::TooManyCategories { line, .. } if line as usize == MAX_CATEGORIES + 1), "{e:?}");
}

#[test]
fn caps_bound_lines_and_content() {
    let text = format!("{}\n{}\n", rec("art", 1, "a"), rec("food", 2, &"b".repeat(100)));
    let e = parse(text.as_bytes(), false, Path::new("c"), u64::MAX, 80).unwrap_err();
    assert!(matches!(e, TextError::LineTooLong { line: 2, cap: 80, .. }), "{e:?}");
    let e = parse(text.as_bytes(), false, Path::new("c"), 100, u64::MAX).unwrap_err();
    assert!(matches!(e, TextError::TooLarge { cap: 100, .. }), "{e:?}");
    assert_eq!(parse(text.as_bytes(), false, Path::new("c"), 1000, 1000).unwrap().len(), 2);
}

#[test]
fn truncated_and_corrupt_gzip_are_refused_with_a_typed_error() {
    let text: String =
        (0..400).map(|i| rec(if i % 3 == 0 { "a" } else { "b" }, i, &"word ".repeat(i as usize % 40)) + "\n").collect();
    let z = gz(text.as_bytes());
    assert_eq!(Corpus::from_bytes(&z, "z").unwrap().len(), 400);
    let e = Corpus::from_bytes(&z[..z.len() / 2], "z.gz").unwrap_err();
    match &e {
        TextError::Decompress { line, .. } => assert!(*line > 1, "{e}"),
        other => panic!("expected Decompress, got {other:?}"),
    }
    assert!(e.to_string().contains("truncated"), "{e}");
    // The CRC trailer damaged: the decoder's check fails at the end.
    let mut bad = z.clone();
    let n = bad.len();
    bad[n - 6] ^= 0xff;
    assert!(matches!(Corpus::from_bytes(&bad, "z.gz"), Err(TextError::Decompress { .. })));
    // The embedded file cut short is refused too, never read as a shorter corpus.
    let e = Corpus::from_bytes(&FORTUNES_GZ[..FORTUNES_GZ.len() - 9], "cut").unwrap_err();
    assert!(matches!(e, TextError::Decompress { .. }), "{e:?}");
}

#[test]
fn load_reads_files_through_the_bounded_reader() {
    let tmp = tempfile::Builder::new().prefix("dc-text-").tempdir().unwrap();
    let text = format!("{}\n{}\n", rec("art", 1, "a"), rec("food", 2, "b"));
    std::fs::write(tmp.path().join("plain.gz"), &text).unwrap();
    std::fs::write(tmp.path().join("zipped.jsonl"), gz(text.as_bytes())).unwrap();
    let a = Corpus::load(tmp.path().join("plain.gz")).unwrap();
    assert_eq!(a, Corpus::load(tmp.path().join("zipped.jsonl")).unwrap());
    assert_eq!(a.len(), 2);
    let e = Corpus::load(tmp.path().join("missing")).unwrap_err();
    assert!(matches!(e, TextError::Input(dropcompute::input::InputError::Io { op: "open", .. })), "{e:?}");
    let z = gz(text.as_bytes());
    std::fs::write(tmp.path().join("cut.gz"), &z[..z.len() - 4]).unwrap();
    // Cut short: refused (the bounded reader reports a decoder's bare end-of-file as its read
    // error), never read as a shorter corpus.
    let e = Corpus::load(tmp.path().join("cut.gz")).unwrap_err();
    assert!(
        matches!(
            &e,
            TextError::Decompress { .. } | TextError::Input(dropcompute::input::InputError::Io { op: "read", .. })
        ),
        "{e:?}"
    );
}

/// The embedded file is the one data/README.md describes: its SHA-256 is written there, and
/// it holds the documented documents and categories.
#[test]
fn embedded_corpus_matches_its_provenance() {
    use sha2::Digest;
    let digest: String = sha2::Sha256::digest(FORTUNES_GZ).iter().map(|b| format!("{b:02x}")).collect();
    let readme = include_str!("../../data/README.md");
    assert!(readme.contains(&digest), "data/README.md does not state the SHA-256 {digest}");
    let c = Corpus::embedded().unwrap();
    assert_eq!((c.len(), c.categories.len()), (15217, 43));
    assert_eq!(c.categories.first().map(String::as_str), Some("art"));
    assert_eq!(c.categories.last().map(String::as_str), Some("zippy"));
    assert!(c.docs[1].text.starts_with(b"A \"critic\" is a man who creates nothing"));
    assert_eq!(c.docs.iter().map(|d| d.text.len()).max(), Some(2434));
}

#[test]
fn split_is_deterministic_disjoint_and_complete() {
    let c = Corpus::embedded().unwrap();
    let (tr, ho) = c.split(0.2, 7).unwrap();
    assert_eq!(ho.len(), (c.len() as f64 * 0.2).round() as usize);
    assert_eq!(tr.len() + ho.len(), c.len());
    assert_eq!(c.split(0.2, 7).unwrap(), (tr.clone(), ho.clone()));
    assert_ne!(c.split(0.2, 8).unwrap().1, ho);
    let key = |d: &Document| (d.category, d.index);
    let mut all: Vec<_> = c.docs.iter().map(key).collect();
    let mut parts: Vec<_> = tr.docs.iter().chain(&ho.docs).map(key).collect();
    all.sort();
    parts.sort();
    assert_eq!(all, parts, "every document in exactly one part ((category, index) is unique)");
    assert_eq!((tr.categories.len(), ho.categories.len()), (43, 43));
    all.dedup();
    assert_eq!(all.len(), c.len());
    for bad in [1.0, -0.1, f64::NAN] {
        assert!(matches!(c.split(bad, 1), Err(TextError::Split(DataError::InvalidSplit { .. }))), "{bad}");
    }
}

#[test]
fn buckets_are_checked_and_pick_the_smallest_that_fits() {
    let bad: [&[u32]; 6] = [&[], &[64, 64], &[128, 64], &[1, 64], &[64, 8193], &[2; 17]];
    for b in bad {
        assert!(matches!(Buckets::new(b.to_vec()), Err(TextError::Buckets { .. })), "{b:?}");
    }
    let b = Buckets::default();
    assert_eq!(b.lengths(), &DEFAULT_BUCKETS);
    for (tokens, want) in
        [(1, 0), (2, 0), (64, 0), (65, 1), (128, 1), (129, 2), (256, 2), (257, 3), (512, 3), (9000, 3)]
    {
        assert_eq!(b.index_of(tokens), want, "{tokens} tokens");
    }
}

#[test]
fn gather_writes_cls_bytes_and_padding_and_truncates_the_longest() {
    // Buckets 4 and 8, micro-batch size 3: lengths 0, 2, 3, 5, 20 bytes -> tokens 1, 3, 4, 6, 8.
    let c = corpus_of(&[0, 2, 3, 5, 20]);
    let plan = BucketPlan::new(&c, Buckets::new(vec![4, 8]).unwrap(), 3, 1).unwrap();
    assert_eq!(plan.doc_tokens(), &[1, 3, 4, 6, 8]);
    assert_eq!(plan.units(), 2);
    let (u0, u1) = (plan.unit(0).unwrap().clone(), plan.unit(1).unwrap().clone());
    assert_eq!((u0.bucket, u1.bucket), (0, 1));
    let mut d0 = u0.docs.clone();
    d0.sort_unstable();
    assert_eq!(d0, vec![0, 1, 2]);
    let mut d1 = u1.docs.clone();
    d1.sort_unstable();
    assert_eq!(d1, vec![3, 4]);
    let b = plan.gather(&c, &[1]).unwrap();
    assert_eq!(b.shape, BatchShape { bucket: 1, len: 8, rows: 3, samples: 2, tokens: 14 });
    assert_eq!(b.shape.padding(), 3 * 8 - 14);
    for (row, &d) in u1.docs.iter().enumerate() {
        let r = &b.tokens[row * 8..row * 8 + 8];
        let text = &c.docs[d as usize].text;
        let mut want = vec![CLS];
        want.extend(text.iter().take(7).map(|&x| i32::from(x)));
        want.resize(8, PAD);
        assert_eq!(r, &want[..], "doc {d}");
        assert_eq!(b.labels[row], i32::from(c.docs[d as usize].category));
    }
    assert_eq!(&b.tokens[16..], &[PAD; 8], "the padding row");
    assert_eq!(b.labels[2], -1);
    // Two units merged (a tail shape's whole launch): the larger bucket, 6 rows.
    let m = plan.shape(&[0, 1]).unwrap();
    assert_eq!(m, BatchShape { bucket: 1, len: 8, rows: 6, samples: 5, tokens: 22 });
    assert_eq!(plan.gather(&c, &[0, 1]).unwrap().tokens.iter().filter(|&&t| t != PAD).count(), 22);
    // Refusals.
    assert!(matches!(plan.shape(&[]), Err(TextError::EmptyMicroBatch)));
    assert!(matches!(plan.shape(&[2]), Err(TextError::UnitOutOfRange { id: 2, units: 2 })));
    assert!(matches!(plan.gather(&corpus_of(&[1]), &[0]), Err(TextError::PlanMismatch { plan: 5, corpus: 1 })));
    assert!(matches!(plan.gather(&corpus_of(&[1, 1, 1, 1, 1]), &[0]), Err(TextError::PlanMismatch { .. })));
    for bad in [0, MAX_MICRO_BATCH_SIZE + 1] {
        assert!(matches!(BucketPlan::new(&c, Buckets::default(), bad, 1), Err(TextError::MicroBatchSize { .. })));
    }
}

#[test]
fn token_counted_sets_the_real_tokens_of_each_dealt_micro_batch() {
    let c = corpus_of(&[0, 2, 3, 5, 20]);
    let plan = Arc::new(BucketPlan::new(&c, Buckets::new(vec![4, 8]).unwrap(), 3, 1).unwrap());
    let mut src = TokenCounted { plan: plan.clone(), inner: RunData::global(plan.units(), 3, 1, 1, Some(1)) };
    let mbs = src.take_assigned(0, &[2]);
    let mut got: Vec<(Vec<u64>, Option<u64>, Option<u32>)> =
        mbs.iter().map(|m| (m.sample_ids.clone(), m.tokens, m.bucket)).collect();
    got.sort();
    // Each micro-batch's bucket as its shape's (what the scheduler's length-aware policies read).
    let bucket = |id: u64| plan.shape(&[id]).map(|s| s.bucket as u32).ok();
    assert_eq!(got, vec![(vec![0], Some(8), bucket(0)), (vec![1], Some(14), bucket(1))]);
    src.settle(0, &[2], Vec::new(), true);
    assert!(src.take_assigned(0, &[2]).is_empty(), "one epoch");
    // The cost-balanced deal sees the parts counted (their buckets) and hands them out so.
    let mut src = TokenCounted { plan: plan.clone(), inner: RunData::global(plan.units(), 3, 1, 1, Some(1)) };
    let mut seen = Vec::new();
    let dealt = src
        .take_dealt(0, 2, &mut |w: &[MicroBatch]| {
            seen = w.iter().map(|m| m.bucket).collect();
            vec![vec![1], vec![0]]
        })
        .expect("a global stream deals");
    assert!(seen.iter().all(Option::is_some), "{seen:?}");
    assert!(dealt.iter().flatten().all(|m| m.bucket.is_some() && m.tokens.is_some()));
    // An id that is not a unit keeps no token count (the scheduler refuses it).
    let mut bad = TokenCounted { plan, inner: dropcompute::schedule::EpochQueue::new(vec![7], 1) };
    assert_eq!(bad.next_micro_batch().unwrap().tokens, None);
}

/// Independent recount of a plan's invariants over `c` (the property tests' oracle).
fn check_plan(c: &Corpus, lengths: &[u32], b: u32, plan: &BucketPlan) -> Result<(), TestCaseError> {
    let max = *lengths.last().unwrap();
    let mut seen = vec![0u32; c.len()];
    let mut short = BTreeMap::<usize, u32>::new();
    for id in 0..plan.units() {
        let u = plan.unit(id).unwrap();
        prop_assert!(!u.docs.is_empty() && u.docs.len() <= b as usize);
        if u.docs.len() < b as usize {
            *short.entry(u.bucket).or_default() += 1;
        }
        let shape = plan.shape(&[id]).unwrap();
        let batch = plan.gather(c, &[id]).unwrap();
        let mut tokens = 0u64;
        for &d in &u.docs {
            seen[d as usize] += 1;
            let t = (c.docs[d as usize].text.len() as u32 + 1).min(max);
            tokens += u64::from(t);
            // The smallest bucket that holds it: this one does, the one below does not.
            prop_assert!(lengths[u.bucket] >= t);
            prop_assert!(u.bucket == 0 || lengths[u.bucket - 1] < t);
        }
        prop_assert_eq!(shape.tokens, tokens);
        prop_assert_eq!(shape.samples as usize, u.docs.len());
        prop_assert_eq!((shape.len, shape.rows), (lengths[u.bucket], b));
        let pads = batch.tokens.iter().filter(|&&t| t == PAD).count() as u64;
        prop_assert_eq!(pads, shape.padding());
        prop_assert_eq!(batch.tokens.len() as u64, u64::from(b) * u64::from(lengths[u.bucket]));
        prop_assert_eq!(batch.labels.iter().filter(|&&l| l >= 0).count(), u.docs.len());
    }
    prop_assert!(seen.iter().all(|&k| k == 1), "every document in exactly one unit");
    prop_assert!(short.values().all(|&k| k <= 1), "at most one short unit per bucket");
    Ok(())
}

/// Deals `plan`'s units for one epoch through every rank's replica of the one dealer, with the
/// given per-step assignments and started counts (clamped to what was dealt), and returns the
/// units started, in order.
fn deal_epoch(plan: &BucketPlan, n: usize, steps: &[(Vec<u32>, Vec<u32>)], seed: u64) -> Vec<u64> {
    let mut reps: Vec<RunData> = (0..n).map(|_| RunData::global(plan.units(), seed, 1, 1, Some(1))).collect();
    let mut started = Vec::new();
    let mut k = 0usize;
    loop {
        let (asg, done) = &steps[k % steps.len()];
        k += 1;
        let slices: Vec<Vec<MicroBatch>> =
            reps.iter_mut().enumerate().map(|(r, d)| d.take_assigned(r as u32, asg)).collect();
        if slices.iter().all(Vec::is_empty) {
            return started;
        }
        // The counts every rank sees after the collective: at least one started in a step
        // whose first rank was dealt any (so the epoch ends).
        let mut done: Vec<u32> = done.iter().zip(&slices).map(|(&d, s)| d.min(s.len() as u32)).collect();
        if done.iter().all(|&d| d == 0) {
            let r = slices.iter().position(|s| !s.is_empty()).unwrap();
            done[r] = 1;
        }
        for (r, d) in reps.iter_mut().enumerate() {
            let kk = done[r] as usize;
            started.extend(slices[r][..kk].iter().flat_map(|m| m.sample_ids.iter().copied()));
            d.settle(r as u32, &done, slices[r][kk..].to_vec(), true);
        }
        assert!(reps.windows(2).all(|w| w[0] == w[1]), "replicas agree");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Bucket assignment and padding, counted exactly, for random lengths, buckets and sizes.
    #[test]
    fn every_document_lands_in_the_smallest_bucket_that_holds_it(
        lengths in proptest::collection::vec(0usize..300, 1..80),
        buckets in proptest::collection::btree_set(2u32..260, 1..5),
        b in 1u32..9,
        seed in any::<u64>(),
    ) {
        let lens: Vec<u32> = buckets.into_iter().collect();
        let c = corpus_of(&lengths);
        let plan = BucketPlan::new(&c, Buckets::new(lens.clone()).unwrap(), b, seed).unwrap();
        check_plan(&c, &lens, b, &plan)?;
        prop_assert_eq!(BucketPlan::new(&c, Buckets::new(lens).unwrap(), b, seed).unwrap(), plan, "deterministic");
    }

    /// Every token of an epoch is started exactly once by the one dealer whatever the
    /// assignments and the drops (every policy only changes those two).
    #[test]
    fn the_dealer_starts_every_token_once_per_epoch(
        lengths in proptest::collection::vec(0usize..600, 1..120),
        b in 1u32..6,
        steps in proptest::collection::vec(
            (proptest::collection::vec(0u32..5, 3), proptest::collection::vec(0u32..5, 3)), 1..6),
        seed in any::<u64>(),
    ) {
        let c = corpus_of(&lengths);
        let plan = BucketPlan::new(&c, Buckets::default(), b, seed).unwrap();
        // An all-zero assignment deals nothing and would end the epoch early: keep one slot.
        let steps: Vec<(Vec<u32>, Vec<u32>)> =
            steps.into_iter().map(|(mut a, d)| { a[0] = a[0].max(1); (a, d) }).collect();
        let started = deal_epoch(&plan, 3, &steps, seed);
        let mut units = started.clone();
        units.sort_unstable();
        prop_assert_eq!(units, (0..plan.units()).collect::<Vec<_>>());
        let tokens: u64 = started.iter().map(|&u| plan.unit(u).unwrap().tokens).sum();
        let want: u64 = c.docs.iter().map(|d| u64::from(d.tokens(512))).sum();
        prop_assert_eq!(tokens, want);
    }

    /// Every strict prefix of a gzip corpus is an error, never a shorter corpus.
    #[test]
    fn gzip_prefixes_fail(cut in 0.0f64..1.0) {
        let text = format!("{}\n{}\n{}\n", rec("a", 1, "a b c"), rec("b", 2, "d e"), rec("a", 3, "f"));
        let z = gz(text.as_bytes());
        let n = ((z.len() as f64) * cut) as usize;
        prop_assert!(Corpus::from_bytes(&z[..n.max(2)], "p.gz").is_err());
    }

    /// Arbitrary bytes never panic.
    #[test]
    fn arbitrary_input_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(c) = Corpus::from_bytes(&bytes, "p") {
            prop_assert!(c.docs.iter().all(|d| usize::from(d.category) < c.categories.len()));
        }
    }
}

/// The replay's data: the one dealer over the plan's units (`RunData::global`), recording the
/// units every rank started; a micro-batch's latency is its bucket's cost (the data knows it
/// from the micro-batch's shape; under a tail shape, the cost of the part at that index: only
/// the timing, never the dealing, depends on it).
struct Ledger<'p> {
    plan: &'p BucketPlan,
    data: RunData,
    slices: Vec<Vec<u64>>,
    started: Vec<u64>,
    dropped: u64,
}

/// Latency of a unit in the replay: 20 µs + 1 µs per (L/64)^2 (attention-like; a scripted
/// model for the test, not the mock's cost model).
fn unit_ns(plan: &BucketPlan, id: u64) -> f64 {
    let len = f64::from(plan.buckets().lengths()[plan.unit(id).unwrap().bucket]);
    20_000.0 + 1_000.0 * (len / 64.0).powi(2)
}

impl ReplayData for Ledger<'_> {
    fn deal(&mut self, _index: usize, assignment: &[u32]) -> Option<Vec<u32>> {
        let _ = self.data.take_assigned(0, assignment);
        let RunData::Shared(s) = &self.data else { panic!("the global stream") };
        self.slices = s.dealt().iter().map(|v| v.iter().flat_map(|m| m.sample_ids.iter().copied()).collect()).collect();
        if self.slices.iter().all(Vec::is_empty) {
            self.data.settle(0, &[], Vec::new(), true);
            return None;
        }
        Some(self.slices.iter().map(|v| v.len() as u32).collect())
    }

    fn settle(&mut self, started: &[u32]) {
        for (s, &k) in self.slices.iter().zip(started) {
            self.started.extend(&s[..k as usize]);
            self.dropped += (s.len() - k as usize) as u64;
        }
        self.data.settle(0, started, Vec::new(), true);
    }

    fn latency(&self, _index: usize, rank: usize, micro_batch: usize) -> Option<f64> {
        self.slices.get(rank)?.get(micro_batch).map(|&id| unit_ns(self.plan, id))
    }
}

/// Every step policy replayed (the one walker and assignment step) on the embedded corpus'
/// plan dealt by the one dealer: every unit, hence every token, of the epoch is started
/// exactly once; the drop policies do drop (and re-queue) work.
#[test]
fn every_policy_computes_every_token_once_per_epoch() {
    let c = Corpus::embedded().unwrap();
    let plan = BucketPlan::new(&c, Buckets::default(), 8, 11).unwrap();
    let (n, m) = (4usize, 4usize);
    // One recorded step of flat latencies; every later step's latencies come from the data.
    let trace =
        LatencyTrace::new("flat", (0..n as u32).collect(), vec![0], m, vec![30_000.0; n * m], vec![10_000.0]).unwrap();
    let exec = ExecutionModel { check: CheckMode::Predictive, warmup_steps: 0, ..ExecutionModel::default() };
    // A deadline of M micro-batches of the 128 bucket: a rank dealt 256/512 units drops.
    let deadline = Threshold::Fixed(Duration::from_nanos((m as f64 * (20_000.0 + 4_000.0)) as u64));
    let want: u64 = c.docs.iter().map(|d| u64::from(d.tokens(512))).sum();
    for policy in Policy::ALL {
        let mut params = StepPolicy::new(policy);
        params.backup_workers = 1;
        params.budget = deadline;
        let run = PolicyRun::new(params, deadline, exec);
        let mut ledger = Ledger {
            plan: &plan,
            data: RunData::global(plan.units(), 5, 1, 1, Some(1)),
            slices: Vec::new(),
            started: Vec::new(),
            dropped: 0,
        };
        let r = replay_policy_on(&trace, &run, &mut ledger);
        let mut units = ledger.started.clone();
        units.sort_unstable();
        assert_eq!(units, (0..plan.units()).collect::<Vec<_>>(), "{policy:?}: every unit once");
        let tokens: u64 = ledger.started.iter().map(|&u| plan.unit(u).unwrap().tokens).sum();
        assert_eq!(tokens, want, "{policy:?}: every token once");
        assert_eq!(r.computed, plan.units(), "{policy:?}: the replay's count");
        if policy.drops() {
            assert!(ledger.dropped > 0, "{policy:?} dropped nothing: the test would not exercise re-queueing");
        }
    }
    // Under a tail shape of split 2 the plan's units are the parts (4 documents each): the
    // replay deals, launches and re-queues parts, and every part is still started once.
    let parts = BucketPlan::new(&c, Buckets::default(), 4, 11).unwrap();
    for policy in Policy::ALL {
        let mut params = StepPolicy::new(policy);
        params.backup_workers = 1;
        params.budget = deadline;
        params.tail = dropcompute::policy::TailShape::split(2);
        let run = PolicyRun::new(params, deadline, exec);
        let data = RunData::global(parts.units(), 5, 1, 1, Some(1));
        let mut ledger = Ledger { plan: &parts, data, slices: Vec::new(), started: Vec::new(), dropped: 0 };
        let r = replay_policy_on(&trace, &run, &mut ledger);
        let mut units = ledger.started.clone();
        units.sort_unstable();
        assert_eq!(units, (0..parts.units()).collect::<Vec<_>>(), "{policy:?} split 2: every part once");
        assert_eq!(r.computed, parts.units(), "{policy:?} split 2");
    }
}

/// The embedded corpus' numbers (data/README.md states them): document and label counts,
/// length quantiles (long-tailed), the bucket histogram, the cost spread the buckets create,
/// and the synchronous step's loss to data-driven straggling when units are dealt by the one
/// dealer. Printed with `--nocapture`.
#[test]
fn embedded_corpus_is_long_tailed_and_its_buckets_spread_the_cost() {
    let c = Corpus::embedded().unwrap();
    let b = 8u32;
    let plan = BucketPlan::new(&c, Buckets::default(), b, 1).unwrap();
    let s = plan.stats(&c);
    println!(
        "documents {} in {} categories, mean tokens {:.1}, truncated to 512: {}",
        s.documents,
        c.categories.len(),
        s.mean_tokens,
        s.truncated
    );
    println!("length quantiles (tokens): {:?}", s.quantiles);
    for row in &s.buckets {
        println!(
            "bucket {:>4}: {:>5} docs, {:>4} micro-batches, {:>8} real tokens, {:>8} padded ({:.1}% real)",
            row.len,
            row.documents,
            row.micro_batches,
            row.tokens,
            row.padded_tokens,
            100.0 * row.tokens as f64 / row.padded_tokens as f64
        );
    }
    for e in [1, 2] {
        println!("cost ~ L^{e}: {:?}", plan.cost_spread(e));
    }
    assert_eq!(s.documents as usize, c.len());
    assert_eq!(s.buckets.iter().map(|r| r.documents).sum::<u64>(), s.documents);
    // Long-tailed: the 99th percentile is many times the median, the longest far beyond.
    let q = |p: f64| s.quantiles.iter().find(|x| x.0 == p).unwrap().1 as f64;
    assert!(q(0.99) > 8.0 * q(0.5), "p99 {} vs median {}", q(0.99), q(0.5));
    assert!(q(1.0) > 20.0 * q(0.5), "longest {} vs median {}", q(1.0), q(0.5));
    let sq = plan.cost_spread(2);
    assert!(sq.cv > 0.5, "{sq:?}");
    assert!(sq.explained_by_bucket > 0.5 && sq.explained_by_bucket <= 1.0, "{sq:?}");

    // The synchronous step under the one dealer: each of N ranks sums the L^2 cost of its M
    // dealt units; the step waits for the largest. Mean over one epoch's full steps of
    // max / mean rank cost (1 = no straggling; the straggler-free bound's gain is this - 1).
    for (n, m) in [(16usize, 8usize), (32, 8)] {
        let mut data = RunData::global(plan.units(), 3, 1, 1, Some(1));
        let (mut ratio, mut steps) = (0.0, 0);
        loop {
            let _ = data.take_assigned(0, &vec![m as u32; n]);
            let RunData::Shared(sh) = &data else { unreachable!() };
            let costs: Vec<f64> = sh
                .dealt()
                .iter()
                .map(|v| v.iter().map(|mb| plan.shape(&mb.sample_ids).map(|x| f64::from(x.len).powi(2)).unwrap()).sum())
                .collect();
            let full = sh.dealt().iter().all(|v| v.len() == m);
            let all = vec![m as u32; n];
            data.settle(0, &all, Vec::new(), true);
            if !full {
                break;
            }
            let mean = costs.iter().sum::<f64>() / n as f64;
            ratio += costs.iter().copied().fold(0.0, f64::max) / mean;
            steps += 1;
        }
        let ratio = ratio / f64::from(steps);
        println!("N={n} M={m}: {steps} full steps, synchronous step / straggler-free step = {ratio:.3}");
        assert!(ratio > 1.2, "data-driven straggling: {ratio}");
    }
}
