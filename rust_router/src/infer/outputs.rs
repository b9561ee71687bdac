//! What the backend's rows become for a request: normalized vectors, activated scores, a
//! sparse row's active pairs.

use crate::backend::ScoreActivation;

pub fn l2_normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|x| (*x as f64) * (*x as f64))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        let scale = (1.0 / norm) as f32;
        v.iter_mut().for_each(|x| *x *= scale);
    }
}

pub fn activate(scores: &mut [f32], activation: ScoreActivation) {
    match activation {
        ScoreActivation::Sigmoid => scores
            .iter_mut()
            .for_each(|s| *s = 1.0 / (1.0 + (-*s).exp())),
        ScoreActivation::Softmax => {
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            scores.iter_mut().for_each(|s| *s /= sum);
        }
    }
}

/// One row of a sparse batch ((index, value) pairs) as its active pairs; pairs of value 0
/// are padding (the row had fewer active dimensions than the batch's widest).
pub(super) fn sparse_pairs(row: &[f32]) -> Vec<(u32, f32)> {
    row.chunks_exact(2)
        .filter(|pair| pair[1] > 0.0)
        .map(|pair| (pair[0] as u32, pair[1]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalization_and_activations() {
        let mut v = vec![3.0, 4.0];
        l2_normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut zero = vec![0.0, 0.0];
        l2_normalize(&mut zero);
        assert_eq!(zero, vec![0.0, 0.0]);

        let mut s = vec![0.0];
        activate(&mut s, ScoreActivation::Sigmoid);
        assert_eq!(s, vec![0.5]);
        let mut s = vec![1.0, 1.0, 1000.0];
        activate(&mut s, ScoreActivation::Softmax);
        assert!((s.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(s[2] > 0.999 && s[0].is_finite());
    }

    #[test]
    fn sparse_rows_drop_their_padding() {
        assert_eq!(
            sparse_pairs(&[3.0, 0.5, 17.0, 1.25, 0.0, 0.0]),
            vec![(3, 0.5), (17, 1.25)]
        );
        assert!(sparse_pairs(&[0.0, 0.0]).is_empty());
    }
}
