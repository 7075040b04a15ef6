//! Extraction of the numeric arguments of every entry point of the extension module.
//!
//! Owns: the refusal of Python's `bool` where a number belongs. `bool` is a subclass of `int`,
//! so pyo3's own extraction takes `True` as 1 and `False` as 0 (`recommend(jitter_ns=True)` ran
//! with a 1 ns window); every numeric parameter (counts, ns, rates, ...) is declared with
//! `#[pyo3(from_py_with = crate::args::number)]` (or its `opt_`/`vec_` forms) and a flag passed
//! there is a `TypeError` naming the parameter (pyo3 prefixes "argument 'NAME': "). Must not
//! touch: the range checks of the values (each entry point's own, through the crate's
//! validations).

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt};

/// Refuses a bool: Python's `bool`, NumPy's bool scalar, or any 0-d boolean array or tensor
/// (`dtype` bool: each converts to 1 or 0 through `__index__` or `__float__`); Err: `TypeError`
/// "{at}got a bool (VALUE) where a number belongs" (`at`: the element's index in a sequence,
/// "[i]: ", or empty). An exact `int` or `float` takes the first check only.
fn refuse_bool(obj: &Bound<'_, PyAny>, at: &str) -> PyResult<()> {
    let flag = obj.is_instance_of::<PyBool>()
        || (!obj.is_exact_instance_of::<PyInt>()
            && !obj.is_exact_instance_of::<PyFloat>()
            && match obj.getattr_opt("dtype")? {
                Some(dtype) => matches!(dtype.str()?.to_cow()?.as_ref(), "bool" | "torch.bool"),
                None => false,
            });
    if flag {
        return Err(PyTypeError::new_err(format!("{at}got a bool ({}) where a number belongs", obj.str()?)));
    }
    Ok(())
}

/// A number (any type pyo3 extracts: unsigned and signed integers, `f64`), never a `bool`.
/// Errors: `TypeError` for a bool or a non-number; pyo3's `OverflowError` for an integer out of
/// the type's range.
pub fn number<'py, T: for<'a> FromPyObject<'a, 'py>>(obj: &Bound<'py, PyAny>) -> PyResult<T> {
    refuse_bool(obj, "")?;
    obj.extract::<T>().map_err(Into::into)
}

/// `None`, or a number as [`number`].
pub fn opt_number<'py, T: for<'a> FromPyObject<'a, 'py>>(obj: &Bound<'py, PyAny>) -> PyResult<Option<T>> {
    if obj.is_none() { Ok(None) } else { number(obj).map(Some) }
}

/// A sequence of numbers, each as [`number`] (a `str` is refused as pyo3 refuses it for a
/// `Vec`). Errors: `TypeError` naming the element's index for a bool; pyo3's for the rest.
pub fn vec_number<'py, T: for<'a> FromPyObject<'a, 'py>>(obj: &Bound<'py, PyAny>) -> PyResult<Vec<T>> {
    // pyo3's own Vec extraction (the sequence checks), then each element.
    let items: Vec<Bound<'py, PyAny>> = obj.extract()?;
    items
        .iter()
        .enumerate()
        .map(|(i, x)| {
            refuse_bool(x, &format!("[{i}]: "))?;
            x.extract::<T>().map_err(Into::into)
        })
        .collect()
}

/// `None`, or a sequence as [`vec_number`].
pub fn opt_vec_number<'py, T: for<'a> FromPyObject<'a, 'py>>(obj: &Bound<'py, PyAny>) -> PyResult<Option<Vec<T>>> {
    if obj.is_none() { Ok(None) } else { vec_number(obj).map(Some) }
}
