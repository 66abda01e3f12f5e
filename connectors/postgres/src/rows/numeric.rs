//! Decimal text → PostgreSQL's binary `numeric` format, with the checks the
//! server would make (so a value that does not fit becomes a dead letter
//! instead of failing the COPY).

/// Largest display scale PostgreSQL stores (`NUMERIC_MAX_DISPLAY_SCALE` is
/// 1000 for typmods, but input may carry up to `NUMERIC_DSCALE_MASK`).
const MAX_DSCALE: usize = 0x3FFF;
/// Most digits before the decimal point PostgreSQL accepts.
const MAX_INTEGER_DIGITS: usize = 131_072;
/// Exponents beyond this are rejected before any arithmetic.
const MAX_EXPONENT: i64 = 1_000_000;

/// A parsed decimal number: `digits × 10^-scale`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decimal {
    NaN,
    Finite {
        negative: bool,
        /// Decimal digits without leading zeros (empty for zero).
        digits: Vec<u8>,
        /// Digits after the decimal point (display scale), never negative.
        scale: usize,
    },
}

/// `numeric(precision, scale)` of a column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NumericTypmod {
    pub precision: u32,
    pub scale: i32,
}

impl NumericTypmod {
    /// Decodes `atttypmod` (`-1`: unconstrained). The scale is an 11-bit signed
    /// number since PostgreSQL 15 (non-negative before, which reads the same).
    pub(crate) fn from_atttypmod(typmod: i32) -> Option<NumericTypmod> {
        if typmod < 4 {
            return None;
        }
        let t = typmod - 4;
        Some(NumericTypmod {
            precision: ((t >> 16) & 0xFFFF) as u32,
            scale: ((t & 0x7FF) ^ 1024) - 1024,
        })
    }
}

impl Decimal {
    /// Parses `[+-]digits[.digits][e[+-]digits]` or `NaN` (surrounding
    /// whitespace allowed), like PostgreSQL's numeric input.
    pub(super) fn parse(text: &str) -> Result<Decimal, String> {
        let s = text.trim();
        if s.eq_ignore_ascii_case("nan") {
            return Ok(Decimal::NaN);
        }
        let not_a_number = || format!("{text:?} is not a number");
        let (negative, rest) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let (mantissa, exponent) = match rest.find(['e', 'E']) {
            Some(i) => {
                let exponent: i64 = rest[i + 1..].parse().map_err(|_| not_a_number())?;
                if exponent.abs() > MAX_EXPONENT {
                    return Err(format!("{text:?} is out of range for numeric"));
                }
                (&rest[..i], exponent)
            }
            None => (rest, 0),
        };
        let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let all_digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
        if int_part.len() + frac_part.len() == 0 || !all_digits(int_part) || !all_digits(frac_part) {
            return Err(not_a_number());
        }
        let mut digits: Vec<u8> = int_part.bytes().chain(frac_part.bytes()).map(|b| b - b'0').collect();
        let mut scale = frac_part.len() as i64 - exponent;
        if scale < 0 {
            digits.extend(std::iter::repeat_n(0, (-scale) as usize));
            scale = 0;
        }
        let scale = scale as usize;
        let leading = digits.iter().take_while(|d| **d == 0).count();
        digits.drain(..leading);
        let decimal = Decimal::Finite {
            negative: negative && !digits.is_empty(),
            digits,
            scale,
        };
        decimal.check_range(text)?;
        Ok(decimal)
    }

    fn check_range(&self, text: &str) -> Result<(), String> {
        if let Decimal::Finite { digits, scale, .. } = self {
            if *scale > MAX_DSCALE || digits.len().saturating_sub(*scale) > MAX_INTEGER_DIGITS {
                return Err(format!("{text:?} is out of range for numeric"));
            }
        }
        Ok(())
    }

    /// Rounds (half away from zero) to the column's scale and checks its
    /// precision, as PostgreSQL does when storing into `numeric(p, s)`.
    pub(super) fn fit(self, typmod: NumericTypmod) -> Result<Decimal, String> {
        let Decimal::Finite {
            negative,
            mut digits,
            scale,
        } = self
        else {
            return Ok(Decimal::NaN);
        };
        let target = typmod.scale;
        let drop = scale as i64 - target as i64;
        if drop > 0 {
            let drop = drop as usize;
            let round_up = if drop <= digits.len() {
                let keep = digits.len() - drop;
                let up = digits[keep] >= 5;
                digits.truncate(keep);
                up
            } else {
                digits.clear();
                false
            };
            if round_up {
                let mut i = digits.len();
                loop {
                    if i == 0 {
                        digits.insert(0, 1);
                        break;
                    }
                    i -= 1;
                    if digits[i] == 9 {
                        digits[i] = 0;
                    } else {
                        digits[i] += 1;
                        break;
                    }
                }
            }
            // digits × 10^-(target); a negative target means trailing zeros.
            if target < 0 {
                digits.extend(std::iter::repeat_n(0, (-target) as usize));
            }
        } else if target > scale as i32 {
            digits.extend(std::iter::repeat_n(0, (target as i64 - scale as i64) as usize));
        }
        let scale = target.max(0) as usize;
        let leading = digits.iter().take_while(|d| **d == 0).count();
        digits.drain(..leading);
        let integer_digits = digits.len().saturating_sub(scale) as i64;
        let allowed = typmod.precision as i64 - typmod.scale as i64;
        if integer_digits > allowed {
            return Err(format!(
                "does not fit numeric({}, {}): it needs {integer_digits} digits before the decimal point, \
                 the column allows {}",
                typmod.precision,
                typmod.scale,
                allowed.max(0)
            ));
        }
        Ok(Decimal::Finite {
            negative: negative && !digits.is_empty(),
            digits,
            scale,
        })
    }

    /// PostgreSQL's binary `numeric`: ndigits, weight, sign, dscale (each 16
    /// bits) and base-10000 digits.
    pub(super) fn to_binary(&self) -> Vec<u8> {
        let (negative, digits, scale) = match self {
            Decimal::NaN => return [0u16, 0, 0xC000, 0].iter().flat_map(|v| v.to_be_bytes()).collect(),
            Decimal::Finite {
                negative,
                digits,
                scale,
            } => (*negative, digits, *scale),
        };
        // Integer and fraction digits, padded to whole base-10000 groups.
        let int_len = digits.len().saturating_sub(scale);
        let int_digits = &digits[..int_len];
        let mut frac: Vec<u8> = std::iter::repeat_n(0, scale.saturating_sub(digits.len())).collect();
        frac.extend_from_slice(&digits[int_len..]);
        let mut padded: Vec<u8> = std::iter::repeat_n(0, (4 - int_digits.len() % 4) % 4).collect();
        padded.extend_from_slice(int_digits);
        let int_groups = padded.len() / 4;
        padded.extend_from_slice(&frac);
        padded.extend(std::iter::repeat_n(0, (4 - frac.len() % 4) % 4));
        let mut groups: Vec<i16> = padded
            .chunks(4)
            .map(|c| c.iter().fold(0i16, |acc, d| acc * 10 + *d as i16))
            .collect();
        let mut weight = int_groups as i64 - 1;
        let leading = groups.iter().take_while(|g| **g == 0).count();
        groups.drain(..leading);
        weight -= leading as i64;
        while groups.last() == Some(&0) {
            groups.pop();
        }
        if groups.is_empty() {
            weight = 0;
        }
        let sign: u16 = if negative { 0x4000 } else { 0 };
        let mut out = Vec::with_capacity(8 + groups.len() * 2);
        out.extend_from_slice(&(groups.len() as i16).to_be_bytes());
        out.extend_from_slice(&(weight as i16).to_be_bytes());
        out.extend_from_slice(&sign.to_be_bytes());
        out.extend_from_slice(&(scale as u16).to_be_bytes());
        for g in groups {
            out.extend_from_slice(&g.to_be_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binary(text: &str) -> Vec<i16> {
        Decimal::parse(text)
            .unwrap()
            .to_binary()
            .chunks(2)
            .map(|c| i16::from_be_bytes([c[0], c[1]]))
            .collect()
    }

    fn fit(text: &str, precision: u32, scale: i32) -> Result<String, String> {
        let d = Decimal::parse(text)?.fit(NumericTypmod { precision, scale })?;
        Ok(match d {
            Decimal::NaN => "NaN".into(),
            Decimal::Finite {
                negative,
                digits,
                scale,
            } => {
                let mut s: String = digits.iter().map(|d| char::from(b'0' + d)).collect();
                while s.len() <= scale {
                    s.insert(0, '0');
                }
                if scale > 0 {
                    s.insert(s.len() - scale, '.');
                }
                if negative {
                    s.insert(0, '-');
                }
                s
            }
        })
    }

    #[test]
    fn encodes_like_postgres() {
        // ndigits, weight, sign, dscale, digits...
        assert_eq!(binary("12345.678"), [3, 1, 0, 3, 1, 2345, 6780]);
        assert_eq!(binary("-0.00001"), [1, -2, 0x4000, 5, 1000]);
        assert_eq!(binary("0.0001234"), [2, -1, 0, 7, 1, 2340]);
        assert_eq!(binary("100000000"), [1, 2, 0, 0, 1]);
        assert_eq!(binary("0"), [0, 0, 0, 0]);
        assert_eq!(binary("-0.00"), [0, 0, 0, 2]);
        assert_eq!(binary("1.50"), [2, 0, 0, 2, 1, 5000]);
        assert_eq!(binary("1.5e3"), [1, 0, 0, 0, 1500]);
        assert_eq!(binary("25e-3"), [1, -1, 0, 3, 250]);
        assert_eq!(binary(" +7 "), [1, 0, 0, 0, 7]);
        assert_eq!(binary("NaN"), [0, 0, 0xC000u16 as i16, 0]);
    }

    #[test]
    fn rejects_what_is_not_a_number() {
        for bad in [
            "",
            "abc",
            "1.2.3",
            "--1",
            "1e",
            "e5",
            ".",
            "1e99999999",
            "Infinity",
            "0x10",
        ] {
            assert!(Decimal::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Decimal::parse(".5").is_ok() && Decimal::parse("5.").is_ok());
    }

    #[test]
    fn fits_precision_and_scale_like_postgres() {
        assert_eq!(fit("1234.567", 6, 2).unwrap(), "1234.57");
        assert_eq!(fit("-1234.565", 6, 2).unwrap(), "-1234.57");
        assert_eq!(fit("0.004", 6, 2).unwrap(), "0.00");
        assert_eq!(fit("-0.004", 6, 2).unwrap(), "0.00");
        assert_eq!(fit("1.5", 6, 3).unwrap(), "1.500");
        assert_eq!(fit("1250", 4, -2).unwrap(), "1300");
        assert!(fit("9999.995", 6, 2).unwrap_err().contains("numeric(6, 2)"));
        assert!(fit("12345.6", 6, 2).is_err());
        assert_eq!(fit("NaN", 6, 2).unwrap(), "NaN");
    }

    #[test]
    fn decodes_typmods() {
        assert_eq!(NumericTypmod::from_atttypmod(-1), None);
        assert_eq!(
            NumericTypmod::from_atttypmod(((6 << 16) | 2) + 4),
            Some(NumericTypmod { precision: 6, scale: 2 })
        );
        assert_eq!(
            NumericTypmod::from_atttypmod(((4 << 16) | (0x7FF & -2i32)) + 4),
            Some(NumericTypmod {
                precision: 4,
                scale: -2
            })
        );
    }
}
