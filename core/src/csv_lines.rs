//! Physical line numbers for CSV records whatever the line endings.
//!
//! Owns: [`LineIndex`] (a reader adapter that records where every `\n` is) and [`LineMap`]
//! (byte offset -> 1-based physical line). The `csv` crate's own `Position::line` counts a
//! `\r\n` file's lines one short after the header, so every parser of this crate (compute logs,
//! What-if CSV, the digits data) names lines from the record's byte offset instead
//! (`csv::Position::byte`). Lines end with `\n` or `\r\n`. Must not touch: parsing itself.

use std::cell::RefCell;
use std::io::Read;
use std::rc::Rc;

/// Wraps a reader; every `\n` and `\r` byte read through it is recorded in the shared
/// [`LineMap`].
pub struct LineIndex<R> {
    inner: R,
    offset: u64,
    ends: Rc<RefCell<Ends>>,
}

/// Offsets of the line-ending bytes seen so far, ascending.
#[derive(Debug, Default)]
struct Ends {
    /// Offsets of `\n`.
    lf: Vec<u64>,
    /// Offsets of `\r`.
    cr: Vec<u64>,
}

/// The line endings seen so far by a [`LineIndex`]: maps a record's byte offset to its
/// physical line. Cheap to clone (shared).
#[derive(Clone, Debug, Default)]
pub struct LineMap(Rc<RefCell<Ends>>);

impl<R: Read> LineIndex<R> {
    /// Wraps `inner`; returns the adapter and the map it fills.
    pub fn new(inner: R) -> (Self, LineMap) {
        let ends = Rc::new(RefCell::new(Ends::default()));
        (Self { inner, offset: 0, ends: ends.clone() }, LineMap(ends))
    }
}

impl<R: Read> Read for LineIndex<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let mut ends = self.ends.borrow_mut();
        for (i, b) in buf[..n].iter().enumerate() {
            match b {
                b'\n' => ends.lf.push(self.offset + i as u64),
                b'\r' => ends.cr.push(self.offset + i as u64),
                _ => {}
            }
        }
        self.offset += n as u64;
        Ok(n)
    }
}

impl LineMap {
    /// 1-based physical line of the first byte at or after `offset` that is not a line ending
    /// (the CSV reader places a record at the end of the previous line's terminator, or before
    /// skipped blank lines): the number of `\n` before that byte, plus one. Exact for every
    /// offset the wrapped reader has already passed, which includes the start of every record
    /// the CSV reader has returned.
    pub fn line_of(&self, offset: u64) -> u64 {
        let ends = self.0.borrow();
        let mut p = offset;
        while ends.lf.binary_search(&p).is_ok() || ends.cr.binary_search(&p).is_ok() {
            p += 1;
        }
        ends.lf.partition_point(|&nl| nl < p) as u64 + 1
    }

    /// The physical line of a CSV position (`None`: 0, unknown).
    pub fn line_of_position(&self, p: Option<&csv::Position>) -> u64 {
        p.map_or(0, |p| self.line_of(p.byte()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_get_their_physical_line_for_lf_and_crlf() {
        for eol in ["\n", "\r\n"] {
            let text = ["a,b", "1,2", "", "3,4", "5,6"].join(eol) + eol;
            let (src, lines) = LineIndex::new(text.as_bytes());
            let mut r = csv::ReaderBuilder::new().has_headers(true).from_reader(src);
            let got: Vec<(String, u64)> = r
                .records()
                .map(|rec| {
                    let rec = rec.unwrap();
                    (rec[0].to_string(), lines.line_of_position(rec.position()))
                })
                .collect();
            assert_eq!(got, vec![("1".into(), 2), ("3".into(), 4), ("5".into(), 5)], "eol {eol:?}");
        }
    }
}
