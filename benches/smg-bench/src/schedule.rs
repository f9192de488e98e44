//! Arrival times of an open-loop run.
//!
//! Inter-arrival gaps are drawn from a gamma distribution with shape
//! `burstiness` and mean `1 / rate`: shape 1 is a Poisson process, below 1
//! arrivals cluster, above 1 they are more regular. The first arrival is at
//! offset 0. The stream is a seeded ChaCha8 generator, so a seed fixes every
//! offset. With rate `inf` every offset is 0 and only the concurrency cap
//! paces sending.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Gamma};

use crate::cli::Rate;
use crate::error::{SetupError, SetupResult};

#[derive(Debug)]
pub struct Arrivals {
    rng: ChaCha8Rng,
    gaps: Option<Gamma<f64>>,
    next: f64,
}

impl Arrivals {
    pub fn new(rate: Rate, burstiness: f64, seed: u64) -> SetupResult<Self> {
        if !(burstiness > 0.0 && burstiness.is_finite()) {
            return Err(SetupError::InvalidArgument(format!(
                "--burstiness must be a positive number, got {burstiness}"
            )));
        }
        let gaps = match rate {
            Rate::Infinite => None,
            Rate::Finite(rate) => Some(
                Gamma::new(burstiness, 1.0 / (rate * burstiness))
                    .map_err(|e| SetupError::InvalidArgument(format!("arrival process: {e}")))?,
            ),
        };
        Ok(Arrivals {
            rng: ChaCha8Rng::seed_from_u64(seed),
            gaps,
            next: 0.0,
        })
    }

    /// Seconds from the start of the run to the next arrival.
    pub fn next_offset(&mut self) -> f64 {
        let offset = self.next;
        if let Some(gaps) = &self.gaps {
            self.next += gaps.sample(&mut self.rng);
        }
        offset
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn gaps(rate: f64, burstiness: f64, seed: u64, n: usize) -> Vec<f64> {
        let mut a = Arrivals::new(Rate::Finite(rate), burstiness, seed).unwrap();
        let offsets: Vec<f64> = (0..=n).map(|_| a.next_offset()).collect();
        offsets.windows(2).map(|w| w[1] - w[0]).collect()
    }

    fn mean_and_cv(v: &[f64]) -> (f64, f64) {
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
        (mean, var.sqrt() / mean)
    }

    #[test]
    fn gaps_have_the_rate_and_the_burstiness_asked_for() {
        // Gamma(k): mean 1/rate, coefficient of variation 1/sqrt(k).
        for (k, cv_expected) in [(1.0, 1.0), (0.25, 2.0), (4.0, 0.5)] {
            let (mean, cv) = mean_and_cv(&gaps(50.0, k, 1, 40_000));
            assert!((mean - 0.02).abs() < 0.02 * 0.05, "k={k} mean={mean}");
            assert!(
                (cv - cv_expected).abs() < cv_expected * 0.08,
                "k={k} cv={cv}"
            );
        }
    }

    #[test]
    fn a_seed_fixes_the_schedule_and_inf_sends_at_once() {
        assert_eq!(gaps(10.0, 1.0, 5, 100), gaps(10.0, 1.0, 5, 100));
        assert_ne!(gaps(10.0, 1.0, 5, 100), gaps(10.0, 1.0, 6, 100));
        let mut inf = Arrivals::new(Rate::Infinite, 1.0, 0).unwrap();
        assert!((0..10).all(|_| inf.next_offset() == 0.0));
        assert!(Arrivals::new(Rate::Finite(1.0), 0.0, 0).is_err());
    }
}
