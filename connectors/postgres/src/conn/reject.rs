//! Rows the server refuses (`on_rejected_row = "dead-letter"`): telling a
//! refused row from every other failure, and finding which rows of a batch
//! the server refuses by trying the batch again in parts.
//!
//! A refusal is an error of SQLSTATE class 22 (data exception: a value out
//! of range, too long, of the wrong form) or 23 (integrity constraint
//! violation: CHECK, NOT NULL, UNIQUE, FOREIGN KEY, EXCLUSION) — what one
//! row can cause. Anything else (a lost connection, a missing privilege, a
//! lock timeout) fails the write as it always does.
//!
//! [`Isolation`] plans the parts of a refused batch to try again, each in a savepoint or a
//! statement of its own (the caller's `attempt`), in the batch's order: a
//! part the server takes is written; a refused part of one row is that
//! row's refusal; a refused part of more is split in two — at the row the
//! server names (a COPY's error says `COPY <table>, line <n>`, which for
//! binary COPY counts rows), or else in halves. Where to split is only a
//! guess: what is concluded comes from the attempts alone, so a wrong or
//! missing hint costs attempts, never a wrong answer. With `k` refused rows
//! among `n` it takes about `3k` attempts when the server names rows, and
//! `2k log(n / k)` when it does not.

use std::ops::Range;

use tokio_postgres::error::DbError;

use super::copy::CopyError;

/// The server refused a row (or a part of a batch with such a row).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The server's words, for the dead-letter table: SQLSTATE, message,
    /// constraint, detail.
    pub message: String,
    /// The row the server names, counted from 1 in the part tried.
    pub row: Option<usize>,
}

/// The refusal in `error`, if it is one (SQLSTATE class 22 or 23).
pub(crate) fn refusal(error: &tokio_postgres::Error) -> Option<Refusal> {
    let db = error.as_db_error()?;
    let class = &db.code().code()[..2];
    if class != "22" && class != "23" {
        return None;
    }
    Some(Refusal {
        message: describe(db),
        row: db.where_().and_then(copy_row),
    })
}

/// The refusal in a failed COPY, if it is one.
pub(crate) fn copy_refusal(error: &CopyError) -> Option<Refusal> {
    match error {
        CopyError::Postgres(error) => refusal(error),
        _ => None,
    }
}

/// `PostgreSQL refused the row: <code> (<class>) <message> (constraint
/// "<name>") [<detail>]`.
fn describe(db: &DbError) -> String {
    let class = match &db.code().code()[..2] {
        "22" => "data exception",
        _ => "integrity constraint violation",
    };
    let mut message = format!(
        "PostgreSQL refused the row: {} ({class}): {}",
        db.code().code(),
        db.message()
    );
    if let Some(constraint) = db.constraint() {
        message.push_str(&format!(" (constraint \"{constraint}\")"));
    }
    if let Some(detail) = db.detail() {
        message.push_str(&format!(" [{detail}]"));
    }
    message.replace('\0', "\\0")
}

/// The row a COPY error's context names: the number after the first comma
/// of `COPY <table>, line <n>[, column ...]` (in any language the server
/// speaks), if there is one.
fn copy_row(context: &str) -> Option<usize> {
    let first = context.lines().next()?;
    if !first.starts_with("COPY ") {
        return None;
    }
    let (_, rest) = first.split_once(", ")?;
    let digits: String = rest
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok().filter(|row| *row > 0)
}

/// Finding the rows of `0..len` the server refuses, given that all of
/// them together were refused: a pure plan of which parts to write next.
/// The caller writes each part [`next`](Isolation::next) gives so that a
/// refusal leaves nothing of it behind (a savepoint rolled back, a
/// statement of its own), tells the answer with
/// [`answer`](Isolation::answer), and in the end has the parts taken
/// written once, in order, and [`refused`](Isolation::refused) the rows
/// refused with why.
#[derive(Debug)]
pub(crate) struct Isolation {
    /// Parts still to write, the next one last; a part may come with the
    /// refusal it is known to meet.
    parts: Vec<(Range<usize>, Option<Refusal>)>,
    /// The part given out and not answered yet.
    asked: Option<Range<usize>>,
    refused: Vec<(usize, Refusal)>,
}

impl Isolation {
    /// Rows `0..len`, refused together with `first`.
    pub(crate) fn new(len: usize, first: Refusal) -> Isolation {
        Isolation {
            parts: vec![(0..len, Some(first))],
            asked: None,
            refused: Vec::new(),
        }
    }

    /// The next part to write, or `None` when every row is written or
    /// refused. Each part must be answered before the next is asked for.
    pub(crate) fn next(&mut self) -> Option<Range<usize>> {
        assert!(self.asked.is_none(), "the last part was not answered");
        while let Some((part, known)) = self.parts.pop() {
            match known {
                _ if part.is_empty() => {}
                Some(refusal) => self.refuse(part, refusal),
                None => {
                    self.asked = Some(part.clone());
                    return Some(part);
                }
            }
        }
        None
    }

    /// What writing the last part gave: `None` when the server took it.
    pub(crate) fn answer(&mut self, refusal: Option<Refusal>) {
        let part = self.asked.take().expect("a part was asked for");
        if let Some(refusal) = refusal {
            self.refuse(part, refusal);
        }
    }

    /// The rows refused, in order, with why.
    pub(crate) fn refused(self) -> Vec<(usize, Refusal)> {
        self.refused
    }

    /// `part` was refused with `refusal`: one row is that row's refusal;
    /// more are split — before the row the server names, that row alone,
    /// the rest — or in halves.
    fn refuse(&mut self, part: Range<usize>, refusal: Refusal) {
        if part.len() == 1 {
            self.refused.push((part.start, refusal));
            return;
        }
        match refusal.row.filter(|row| *row <= part.len()) {
            Some(row) => {
                let named = part.start + row - 1;
                self.parts.push((named + 1..part.end, None));
                self.parts.push((named..named + 1, None));
                self.parts.push((part.start..named, None));
            }
            None => {
                let middle = part.start + part.len() / 2;
                self.parts.push((middle..part.end, None));
                self.parts.push((part.start..middle, None));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused_at(row: Option<usize>) -> Refusal {
        Refusal {
            message: "no".into(),
            row,
        }
    }

    /// Runs an [`Isolation`] over `len` rows where `bad` are refused, with
    /// the server naming the first refused row of a part when `names_rows`.
    /// Returns the refused rows, the rows written (in order) and the
    /// attempts.
    fn run(len: usize, bad: &[usize], names_rows: bool) -> (Vec<usize>, Vec<usize>, usize) {
        let mut written = Vec::new();
        let mut attempts = 0;
        let first = bad.iter().min().map(|b| b + 1).filter(|_| names_rows);
        let mut isolation = Isolation::new(len, refused_at(first));
        while let Some(part) = isolation.next() {
            attempts += 1;
            let answer = match part.clone().find(|i| bad.contains(i)) {
                Some(i) => Some(refused_at(names_rows.then_some(i - part.start + 1))),
                None => {
                    written.extend(part);
                    None
                }
            };
            isolation.answer(answer);
        }
        let refused = isolation.refused().into_iter().map(|(i, _)| i).collect();
        (refused, written, attempts)
    }

    #[test]
    fn exactly_the_refused_rows_are_found_and_every_other_row_is_written_once_in_order() {
        for names_rows in [false, true] {
            for (len, bad) in [
                (1, vec![0]),
                (2, vec![1]),
                (10, vec![0, 9]),
                (100, vec![3, 4, 5, 50, 99]),
                (1000, (0..1000).filter(|i| i % 100 == 7).collect::<Vec<_>>()),
                (7, (0..7).collect()),
            ] {
                let (refused, written, attempts) = run(len, &bad, names_rows);
                assert_eq!(refused, bad, "{len} rows, hints {names_rows}");
                let good: Vec<usize> = (0..len).filter(|i| !bad.contains(i)).collect();
                assert_eq!(written, good, "{len} rows, hints {names_rows}: written once, in order");
                if len == 1000 {
                    let bound = if names_rows {
                        3 * bad.len() + 1
                    } else {
                        2 * bad.len() * 10
                    };
                    assert!(attempts <= bound, "{attempts} attempts, hints {names_rows}");
                }
            }
        }
    }

    #[test]
    fn a_wrong_hint_costs_attempts_but_not_the_answer() {
        let mut written = Vec::new();
        let mut isolation = Isolation::new(64, refused_at(Some(3)));
        while let Some(part) = isolation.next() {
            let answer = if part.contains(&40) {
                // The server names a row, but the wrong one (and beyond the part).
                Some(refused_at(Some(part.len() + 5)))
            } else {
                written.extend(part);
                None
            };
            isolation.answer(answer);
        }
        assert_eq!(isolation.refused().iter().map(|(i, _)| *i).collect::<Vec<_>>(), [40]);
        assert_eq!(written, (0..64).filter(|i| *i != 40).collect::<Vec<_>>());
    }

    #[test]
    fn the_row_of_a_copy_error_is_read_from_its_context() {
        assert_eq!(copy_row("COPY orders, line 37"), Some(37));
        assert_eq!(copy_row("COPY orders, line 2, column v: \"x\""), Some(2));
        assert_eq!(copy_row("COPY \"a, b\", Zeile 5"), Some(5));
        assert_eq!(copy_row("SQL statement \"SELECT 1\""), None);
        assert_eq!(copy_row("COPY orders"), None);
        assert_eq!(copy_row("COPY orders, line 0"), None);
    }
}
