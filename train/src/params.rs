//! The parameters file of `train --out` (`params_<run>.safetensors`) and `train --init-params`:
//! the MLP's (digits) or the transformer's (`--task text`) parameters in the safetensors format (crate `safetensors`; the format of Hugging
//! Face's `safetensors` library, loadable from Python with `safetensors.numpy.load_file`).
//!
//! Owns: [`to_safetensors`] and [`read_safetensors`] / [`load`] (digits), [`text_to_safetensors`]
//! and [`read_text_safetensors`] / [`load_text`] / [`load_text_for`] (text). Must not touch: the
//! model math or the flat layouts (`mlp::MlpShape` and `transformer::TransformerConfig::blocks`
//! own them), checkpoints (`ckpt`: a separate, crash-safe
//! format with optimizer state).
//!
//! File layout: four little-endian `F32` tensors named after [`mlp::MlpShape`]'s blocks,
//! `w1` `[input, hidden]`, `b1` `[hidden]`, `w2` `[hidden, classes]`, `b2` `[classes]` (row-major,
//! the same bits as the flat vector), and the string metadata `format` = [`FORMAT`], `run` (the
//! run label) and `steps` (optimizer steps taken, a resumed run's earlier steps included).
//!
//! Text layout: one little-endian `F32` tensor per block of `TransformerConfig::blocks`, named
//! and shaped as the block (`tok_emb [258, D]`, `pos_emb [max_len, D]`, `l0_wq [D, D]`, ...,
//! `head_b [258]`; the same bits as the flat vector), and the string metadata `format` =
//! [`TEXT_FORMAT`], `run`, `steps` and the model's sizes `d_model`, `heads`, `layers`, `d_ff`,
//! `max_len` (the reader rebuilds the model from them and checks every block's shape).
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use super::mlp::MlpShape;
use super::transformer::TransformerConfig;

/// The `format` metadata value of a text parameters file.
pub const TEXT_FORMAT: &str = "dropcompute-transformer-v1";

/// The size fields of a text parameters file's metadata, in [`TransformerConfig`]'s order.
const TEXT_SIZES: [&str; 5] = ["d_model", "heads", "layers", "d_ff", "max_len"];

/// The `format` metadata value of a parameters file.
pub const FORMAT: &str = "dropcompute-mlp-v1";

/// Tensor names in layout order.
pub const TENSORS: [&str; 4] = ["w1", "b1", "w2", "b2"];

/// Errors of writing or reading a parameters file; each names the file (or `<memory>`).
#[derive(Debug, thiserror::Error)]
pub enum ParamsError {
    /// The bounded reader refused the file (`dropcompute::input`, kind parameters: absent, a
    /// directory, the size cap, a stop signal while waiting for a FIFO).
    #[error("{0}")]
    Input(#[from] dropcompute::input::InputError),
    /// The file cannot be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// Not a safetensors file, or one this crate cannot encode (the crate's message).
    #[error("{}: not a valid safetensors file: {message}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// The safetensors crate's error.
        message: String,
    },
    /// A tensor is missing, has another dtype, or shapes that do not form one MLP.
    #[error("{}: {message}", path.display())]
    Layout {
        /// The file.
        path: PathBuf,
        /// What is wrong (tensor name, dtype, shape).
        message: String,
    },
    /// The file's model does not match the job's (`--init-params` with another `--hidden` or
    /// data set).
    #[error("{}: parameters of a {found:?} model, the job needs {expected:?}", path.display())]
    ShapeMismatch {
        /// The file.
        path: PathBuf,
        /// Shape stored in the file.
        found: MlpShape,
        /// Shape the job uses.
        expected: MlpShape,
    },
}

fn ranges(shape: MlpShape) -> [(Range<usize>, Vec<usize>); 4] {
    let (i, h, c) = (shape.input, shape.hidden, shape.classes);
    [(shape.w1(), vec![i, h]), (shape.b1(), vec![h]), (shape.w2(), vec![h, c]), (shape.b2(), vec![c])]
}

/// The safetensors bytes of `params` (flat layout of `shape`) with metadata `run` and `steps`.
///
/// # Errors
/// [`ParamsError::Layout`] when `params.len() != shape.param_len()`; [`ParamsError::Format`]
/// if the crate refuses to encode (not expected for these shapes).
pub fn to_safetensors(shape: MlpShape, params: &[f32], run: &str, steps: u64) -> Result<Vec<u8>, ParamsError> {
    let mem = || PathBuf::from("<memory>");
    if params.len() != shape.param_len() {
        return Err(ParamsError::Layout {
            path: mem(),
            message: format!("{} parameters for a {shape:?} model of {}", params.len(), shape.param_len()),
        });
    }
    let bytes: Vec<u8> = params.iter().flat_map(|x| x.to_le_bytes()).collect();
    let fmt = |e: safetensors::SafeTensorError| ParamsError::Format { path: mem(), message: e.to_string() };
    let mut views = Vec::with_capacity(4);
    for (name, (r, dims)) in TENSORS.iter().zip(ranges(shape)) {
        views.push((*name, TensorView::new(Dtype::F32, dims, &bytes[r.start * 4..r.end * 4]).map_err(fmt)?));
    }
    let meta = HashMap::from([
        ("format".to_owned(), FORMAT.to_owned()),
        ("run".to_owned(), run.to_owned()),
        ("steps".to_owned(), steps.to_string()),
    ]);
    safetensors::serialize(views, Some(meta)).map_err(fmt)
}

/// Parses a parameters file's bytes (`path` labels errors): the model shape it holds and the
/// flat parameters (bit for bit the stored values).
///
/// # Errors
/// [`ParamsError::Format`] for bytes that are not safetensors; [`ParamsError::Layout`] for a
/// missing tensor, a dtype other than F32, or shapes that are not `w1 [i, h]`, `b1 [h]`,
/// `w2 [h, c]`, `b2 [c]` with i, h >= 1 and c >= 2.
pub fn read_safetensors(path: &Path, bytes: &[u8]) -> Result<(MlpShape, Vec<f32>), ParamsError> {
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| ParamsError::Format { path: path.into(), message: e.to_string() })?;
    let layout = |message: String| ParamsError::Layout { path: path.into(), message };
    let mut views = Vec::with_capacity(4);
    for name in TENSORS {
        let v = st.tensor(name).map_err(|e| layout(format!("tensor {name}: {e}")))?;
        if v.dtype() != Dtype::F32 {
            return Err(layout(format!("tensor {name}: dtype {:?}, expected F32", v.dtype())));
        }
        views.push(v);
    }
    let dims: Vec<&[usize]> = views.iter().map(|v| v.shape()).collect();
    let shape = match dims[..] {
        [[i, h], [h1], [h2, c], [c1]] if h == h1 && h == h2 && c == c1 => {
            MlpShape { input: *i, hidden: *h, classes: *c }
        }
        _ => return Err(layout(format!("shapes {dims:?} are not w1 [i, h], b1 [h], w2 [h, c], b2 [c]"))),
    };
    shape.validate().map_err(|e| layout(e.to_string()))?;
    let mut params = Vec::with_capacity(shape.param_len());
    for v in &views {
        params.extend(v.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
    }
    Ok((shape, params))
}

/// Reads the parameters file at `path` ([`read_safetensors`]).
///
/// # Errors
/// [`ParamsError::Input`] when the bounded reader (`dropcompute::input`, kind parameters)
/// refuses the file or cannot read it; as [`read_safetensors`].
pub fn load(path: &Path) -> Result<(MlpShape, Vec<f32>), ParamsError> {
    let bytes = dropcompute::input::read(path, dropcompute::input::InputKind::Params)?;
    read_safetensors(path, &bytes)
}

/// Reads `path` for a job of model `expected` (`train --init-params`).
///
/// # Errors
/// As [`load`]; [`ParamsError::ShapeMismatch`] when the file holds another model.
pub fn load_for(path: &Path, expected: MlpShape) -> Result<Vec<f32>, ParamsError> {
    let (found, params) = load(path)?;
    if found != expected {
        return Err(ParamsError::ShapeMismatch { path: path.into(), found, expected });
    }
    Ok(params)
}

/// The safetensors bytes of the transformer's `params` (flat layout of `cfg.blocks()`) with
/// metadata `run`, `steps` and the sizes of `cfg` (the module's text layout).
///
/// # Errors
/// [`ParamsError::Layout`] when `params.len() != cfg.param_len()`; [`ParamsError::Format`] if
/// the crate refuses to encode.
pub fn text_to_safetensors(
    cfg: &TransformerConfig,
    params: &[f32],
    run: &str,
    steps: u64,
) -> Result<Vec<u8>, ParamsError> {
    let mem = || PathBuf::from("<memory>");
    if params.len() != cfg.param_len() {
        return Err(ParamsError::Layout {
            path: mem(),
            message: format!("{} parameters for a transformer {} of {}", params.len(), cfg.tag(), cfg.param_len()),
        });
    }
    let bytes: Vec<u8> = params.iter().flat_map(|x| x.to_le_bytes()).collect();
    let fmt = |e: safetensors::SafeTensorError| ParamsError::Format { path: mem(), message: e.to_string() };
    let blocks = cfg.blocks();
    let mut views = Vec::with_capacity(blocks.len());
    for b in &blocks {
        let r = b.range();
        let dims = b.shape.iter().map(|&x| x as usize).collect();
        views.push((b.name.as_str(), TensorView::new(Dtype::F32, dims, &bytes[r.start * 4..r.end * 4]).map_err(fmt)?));
    }
    let sizes = [cfg.d_model, cfg.heads, cfg.layers, cfg.d_ff, cfg.max_len];
    let mut meta = HashMap::from([
        ("format".to_owned(), TEXT_FORMAT.to_owned()),
        ("run".to_owned(), run.to_owned()),
        ("steps".to_owned(), steps.to_string()),
    ]);
    meta.extend(TEXT_SIZES.iter().zip(sizes).map(|(k, v)| ((*k).to_owned(), v.to_string())));
    safetensors::serialize(views, Some(meta)).map_err(fmt)
}

/// Parses a text parameters file's bytes (`path` labels errors): the transformer's sizes (from
/// the metadata, validated) and the flat parameters (bit for bit the stored values).
///
/// # Errors
/// [`ParamsError::Format`] for bytes that are not safetensors; [`ParamsError::Layout`] for a
/// `format` other than [`TEXT_FORMAT`], a missing or invalid size, a missing block tensor, a
/// dtype other than F32 or a block of another shape than the sizes give.
pub fn read_text_safetensors(path: &Path, bytes: &[u8]) -> Result<(TransformerConfig, Vec<f32>), ParamsError> {
    let layout = |message: String| ParamsError::Layout { path: path.into(), message };
    let format = |e: safetensors::SafeTensorError| ParamsError::Format { path: path.into(), message: e.to_string() };
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(format)?;
    let meta = header.metadata().clone().unwrap_or_default();
    match meta.get("format") {
        Some(f) if f == TEXT_FORMAT => {}
        f => return Err(layout(format!("format {f:?}, expected {TEXT_FORMAT:?} (a text model's parameters)"))),
    }
    let mut sizes = [0u32; 5];
    for (k, v) in TEXT_SIZES.iter().zip(sizes.iter_mut()) {
        let raw = meta.get(*k).ok_or_else(|| layout(format!("metadata {k} missing")))?;
        *v = raw.parse().map_err(|e| layout(format!("metadata {k} = {raw:?}: {e}")))?;
    }
    let [d_model, heads, layers, d_ff, max_len] = sizes;
    let cfg = TransformerConfig { d_model, heads, layers, d_ff, max_len };
    cfg.validate().map_err(|e| layout(e.to_string()))?;
    let st = SafeTensors::deserialize(bytes).map_err(format)?;
    let mut params = Vec::with_capacity(cfg.param_len());
    for b in cfg.blocks() {
        let v = st.tensor(&b.name).map_err(|e| layout(format!("tensor {}: {e}", b.name)))?;
        let want: Vec<usize> = b.shape.iter().map(|&x| x as usize).collect();
        if v.dtype() != Dtype::F32 || v.shape() != want.as_slice() {
            return Err(layout(format!(
                "tensor {}: {:?} {:?}, expected F32 {want:?} (model {})",
                b.name,
                v.dtype(),
                v.shape(),
                cfg.tag()
            )));
        }
        params.extend(v.data().chunks_exact(4).map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]])));
    }
    Ok((cfg, params))
}

/// Reads the text parameters file at `path` ([`read_text_safetensors`]).
///
/// # Errors
/// [`ParamsError::Input`] when the bounded reader refuses the file; as
/// [`read_text_safetensors`].
pub fn load_text(path: &Path) -> Result<(TransformerConfig, Vec<f32>), ParamsError> {
    let bytes = dropcompute::input::read(path, dropcompute::input::InputKind::Params)?;
    read_text_safetensors(path, &bytes)
}

/// Reads `path` for a text job of model `expected` (`train --task text --init-params`).
///
/// # Errors
/// As [`load_text`]; [`ParamsError::Layout`] naming both models' sizes when the file holds
/// another one (`--text-model`).
pub fn load_text_for(path: &Path, expected: &TransformerConfig) -> Result<Vec<f32>, ParamsError> {
    let (found, params) = load_text(path)?;
    if found != *expected {
        return Err(ParamsError::Layout {
            path: path.into(),
            message: format!("parameters of a transformer {}, the job needs {}", found.tag(), expected.tag()),
        });
    }
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: MlpShape = MlpShape { input: 3, hidden: 2, classes: 4 };

    fn params() -> Vec<f32> {
        // Distinct bit patterns, including -0.0, a subnormal and NaN with a payload.
        let mut p: Vec<f32> = (0..SHAPE.param_len()).map(|i| i as f32 * 0.25 - 1.0).collect();
        p[0] = -0.0;
        p[1] = f32::from_bits(1);
        p[2] = f32::from_bits(0x7fc0_1234);
        p
    }

    #[test]
    fn round_trip_is_bitwise_and_tensors_have_the_model_shapes() {
        let p = params();
        let bytes = to_safetensors(SHAPE, &p, "dropcompute", 7).expect("encode");
        let (shape, back) = read_safetensors(Path::new("p.safetensors"), &bytes).expect("decode");
        assert_eq!(shape, SHAPE);
        assert_eq!(
            back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            p.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        let st = SafeTensors::deserialize(&bytes).expect("safetensors");
        assert_eq!(st.tensor("w1").expect("w1").shape(), [3, 2]);
        assert_eq!(st.tensor("b2").expect("b2").shape(), [4]);
        // b1 starts at input * hidden = 6: its first value is p[6].
        assert_eq!(st.tensor("b1").expect("b1").data()[..4], p[6].to_le_bytes());
        let (_, meta) = SafeTensors::read_metadata(&bytes).expect("header");
        let m = meta.metadata().clone().expect("metadata");
        assert_eq!((m["format"].as_str(), m["run"].as_str(), m["steps"].as_str()), (FORMAT, "dropcompute", "7"));
    }

    #[test]
    fn text_round_trip_is_bitwise_with_block_shapes_and_sizes() {
        let cfg = TransformerConfig::TINY;
        let mut p: Vec<f32> = (0..cfg.param_len()).map(|i| (i as f32).mul_add(1e-3, -0.5)).collect();
        p[0] = -0.0;
        p[1] = f32::from_bits(0x7fc0_0042);
        let bytes = text_to_safetensors(&cfg, &p, "baseline", 9).expect("encode");
        let (back_cfg, back) = read_text_safetensors(Path::new("t.safetensors"), &bytes).expect("decode");
        assert_eq!(back_cfg, cfg);
        assert!(back.iter().map(|x| x.to_bits()).eq(p.iter().map(|x| x.to_bits())));
        let st = SafeTensors::deserialize(&bytes).expect("safetensors");
        // pos_emb follows tok_emb (258 x 8): its first value is p[2064].
        assert_eq!(st.tensor("tok_emb").expect("tok_emb").shape(), [258, 8]);
        assert_eq!(st.tensor("pos_emb").expect("pos_emb").data()[..4], p[258 * 8].to_le_bytes());
        assert_eq!(st.tensor("l0_w1").expect("w1").shape(), [8, 16]);
        let (_, meta) = SafeTensors::read_metadata(&bytes).expect("header");
        let m = meta.metadata().clone().expect("metadata");
        assert_eq!((m["format"].as_str(), m["steps"].as_str(), m["max_len"].as_str()), (TEXT_FORMAT, "9", "16"));
        // A digits file is not a text file, and another model size is refused by name.
        let digits = to_safetensors(SHAPE, &params(), "r", 1).expect("digits");
        let e = read_text_safetensors(Path::new("d.safetensors"), &digits).expect_err("digits");
        assert!(e.to_string().contains(TEXT_FORMAT), "{e}");
        let dir = tempfile::tempdir().expect("dir");
        let f = dir.path().join("t.safetensors");
        std::fs::write(&f, &bytes).expect("write");
        assert!(load_text_for(&f, &cfg).is_ok());
        let e = load_text_for(&f, &TransformerConfig::DEFAULT).expect_err("other size");
        assert!(e.to_string().contains(&cfg.tag()) && e.to_string().contains(&TransformerConfig::DEFAULT.tag()), "{e}");
        assert!(text_to_safetensors(&cfg, &[1.0], "r", 0).is_err(), "wrong length");
    }

    #[test]
    fn bad_files_are_typed_errors_naming_the_file() {
        let p = Path::new("x.safetensors");
        let e = read_safetensors(p, b"not a file").expect_err("garbage");
        assert!(matches!(e, ParamsError::Format { .. }) && e.to_string().starts_with("x.safetensors"), "{e}");
        let other = MlpShape { input: 3, hidden: 5, classes: 4 };
        let bytes = to_safetensors(other, &vec![0.5; other.param_len()], "r", 1).expect("encode");
        let dir = tempfile::tempdir().expect("dir");
        let f = dir.path().join("p.safetensors");
        std::fs::write(&f, &bytes).expect("write");
        let e = load_for(&f, SHAPE).expect_err("other model");
        assert!(matches!(e, ParamsError::ShapeMismatch { found, .. } if found == other), "{e}");
        // A tensor with another dtype.
        let half = [0u8; 2 * 4];
        let views = vec![("w1", TensorView::new(Dtype::F16, vec![2, 2], &half).expect("view"))];
        let e = read_safetensors(p, &safetensors::serialize(views, None).expect("ser")).expect_err("f16");
        assert!(e.to_string().contains("F16"), "{e}");
        assert!(to_safetensors(SHAPE, &[1.0], "r", 0).is_err(), "wrong length");
        assert!(matches!(
            load(&dir.path().join("missing")),
            Err(ParamsError::Input(dropcompute::input::InputError::Io { .. }))
        ));
    }
}
