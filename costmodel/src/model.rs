//! Cost models: fit on (features, target, weight), predict a score where lower is faster.

use std::fmt;
use std::str::FromStr;

use linfa::prelude::*;
use linfa_elasticnet::ElasticNetParams;
use ndarray::{Array1, Array2};
use smartcore::ensemble::random_forest_regressor::{
    RandomForestRegressor, RandomForestRegressorParameters,
};
use smartcore::linalg::basic::matrix::DenseMatrix;

/// Fewest training points a model accepts; below it [`CostModel::fit`] declines with
/// [`ModelError::TooFewPoints`] and a model-guided search samples randomly instead.
pub const MIN_POINTS: usize = 8;

/// Why a model could not be fitted or used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    /// Fewer than [`MIN_POINTS`] usable (positive-weight) training points: callers sample
    /// randomly instead.
    #[error("too few training points ({have}; a model needs at least {need})")]
    TooFewPoints {
        /// Usable points in the training set.
        have: usize,
        /// The least a model accepts, [`MIN_POINTS`].
        need: usize,
    },
    /// Malformed data: a [`TrainingSet`]'s columns of different lengths, rows of different
    /// widths, a non-finite value or a negative weight; or, for [`LinearModel`], rows to
    /// predict of another width than the fit's.
    #[error("training data is malformed: {0}")]
    BadData(String),
    /// A held-out evaluation (such as `search`'s replay of recorded spaces) whose split leaves
    /// too few points to score; [`CostModel::fit`] never returns it.
    #[error(
        "fitting on {train} of the {points} measured points leaves fewer than {need} to score"
    )]
    NothingToScore {
        /// Points the model was to be fitted on.
        train: usize,
        /// Measured points available in all.
        points: usize,
        /// Held-out points the metrics need (their top-k recall's `k`).
        need: usize,
    },
    /// A prediction asked of a model that no [`CostModel::fit`] has succeeded on yet.
    #[error("the model has not been fitted")]
    NotFitted,
    /// The underlying library (smartcore, linfa) failed.
    #[error("{model} failed: {reason}")]
    Backend {
        /// The model's [`CostModel::name`] (`forest`, `linear`).
        model: &'static str,
        /// The library's error message.
        reason: String,
    },
}

/// Training data: one feature row per point, its target (lower is faster, e.g.
/// [`target`](crate::target)) and its weight (1 for the workload being tuned, less for points
/// transferred from other workloads or machines).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrainingSet {
    /// Feature rows, one per point, all of one width (e.g. [`features`](crate::features)).
    pub x: Vec<Vec<f64>>,
    /// Targets, one per point; lower is faster.
    pub y: Vec<f64>,
    /// Weights, one per point, finite and ≥ 0; points of weight 0 do not count towards
    /// [`MIN_POINTS`].
    pub w: Vec<f64>,
}

impl TrainingSet {
    /// An empty set.
    pub fn new() -> Self {
        TrainingSet::default()
    }

    /// Adds one point.
    pub fn push(&mut self, x: Vec<f64>, y: f64, w: f64) {
        self.x.push(x);
        self.y.push(y);
        self.w.push(w);
    }

    /// Number of points.
    pub fn len(&self) -> usize {
        self.y.len()
    }

    /// Whether there are no points.
    pub fn is_empty(&self) -> bool {
        self.y.is_empty()
    }

    /// Checks shapes and values; returns the number of features.
    fn validate(&self) -> Result<usize, ModelError> {
        if self.x.len() != self.y.len() || self.w.len() != self.y.len() {
            return Err(ModelError::BadData(format!(
                "{} rows, {} targets, {} weights",
                self.x.len(),
                self.y.len(),
                self.w.len()
            )));
        }
        let usable = self.w.iter().filter(|&&w| w > 0.0).count();
        if usable < MIN_POINTS {
            return Err(ModelError::TooFewPoints {
                have: usable,
                need: MIN_POINTS,
            });
        }
        let p = self.x[0].len();
        if p == 0 || self.x.iter().any(|r| r.len() != p) {
            return Err(ModelError::BadData("rows of different lengths".into()));
        }
        let finite = self.x.iter().flatten().chain(&self.y).chain(&self.w);
        if finite.into_iter().any(|v| !v.is_finite()) || self.w.iter().any(|&w| w < 0.0) {
            return Err(ModelError::BadData(
                "non-finite value or negative weight".into(),
            ));
        }
        Ok(p)
    }
}

/// A learned cost model.
pub trait CostModel: Send {
    /// Short name (`forest`, `linear`).
    fn name(&self) -> &'static str;

    /// Fits on `data`, replacing any previous fit. Declines with
    /// [`ModelError::TooFewPoints`] below [`MIN_POINTS`] usable (positive-weight) points.
    fn fit(&mut self, data: &TrainingSet) -> Result<(), ModelError>;

    /// Predicted targets (lower is faster), one per row.
    fn predict(&self, x: &[Vec<f64>]) -> Result<Vec<f64>, ModelError>;

    /// Predicted targets with their uncertainty, one `(mean, spread)` per row: the spread is
    /// a standard deviation in target units (for the forest, across its trees). Models
    /// without an uncertainty estimate report a spread of 0, so an acquisition function
    /// built on it falls back to the plain prediction.
    fn predict_spread(&self, x: &[Vec<f64>]) -> Result<Vec<(f64, f64)>, ModelError> {
        Ok(self.predict(x)?.into_iter().map(|m| (m, 0.0)).collect())
    }
}

/// The models autokernel offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelKind {
    /// Random forest regression (smartcore): the default, chosen by held-out ranking metrics
    /// (see `bench_results/<fingerprint>/costmodel.md`).
    Forest,
    /// Elastic-net regression (linfa) on standardised features and their squares.
    Linear,
}

impl ModelKind {
    /// Every kind, default first.
    pub const ALL: [ModelKind; 2] = [ModelKind::Forest, ModelKind::Linear];
    /// The default model.
    pub const DEFAULT: ModelKind = ModelKind::Forest;

    /// The name accepted by [`FromStr`].
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Forest => "forest",
            ModelKind::Linear => "linear",
        }
    }

    /// A fresh, unfitted model; `seed` fixes any randomness of fitting.
    pub fn build(self, seed: u64) -> Box<dyn CostModel> {
        match self {
            ModelKind::Forest => Box::new(ForestModel::new(seed)),
            ModelKind::Linear => Box::new(LinearModel::new()),
        }
    }
}

impl fmt::Display for ModelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A model name that is not one of [`ModelKind::ALL`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown model '{0}' (known: {known})", known = ModelKind::ALL.map(ModelKind::name).join(", "))]
pub struct UnknownModel(pub String);

impl FromStr for ModelKind {
    type Err = UnknownModel;

    fn from_str(s: &str) -> Result<Self, UnknownModel> {
        ModelKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownModel(s.to_string()))
    }
}

type Forest = RandomForestRegressor<f64, f64, DenseMatrix<f64>, Vec<f64>>;

/// Random forest regression on the raw features (trees need no scaling), with sample
/// weights. Deterministic for a seed.
///
/// Each tree is grown as its own one-tree smartcore forest (weighted bootstrap, a third of
/// the features per split), so that the trees' individual predictions are available: their
/// mean is the prediction and their standard deviation the uncertainty
/// ([`CostModel::predict_spread`]) — large where the bootstrap samples disagree, e.g. on
/// configs unlike anything measured, or where transferred records contradict each other.
pub struct ForestModel {
    /// Trees in the forest.
    pub trees: usize,
    /// Smallest leaf.
    pub min_leaf: usize,
    seed: u64,
    fitted: Vec<Forest>,
    /// Features per row of the fit (rows to predict must have as many).
    width: usize,
}

impl ForestModel {
    /// 48 trees, leaves of at least 1 point, a third of the features tried per split.
    pub fn new(seed: u64) -> Self {
        ForestModel {
            trees: 48,
            min_leaf: 1,
            seed,
            fitted: Vec::new(),
            width: 0,
        }
    }
}

fn dense(x: &[Vec<f64>]) -> Result<DenseMatrix<f64>, ModelError> {
    DenseMatrix::from_2d_vec(&x.to_vec()).map_err(|e| ModelError::Backend {
        model: "forest",
        reason: e.to_string(),
    })
}

impl CostModel for ForestModel {
    fn name(&self) -> &'static str {
        "forest"
    }

    fn fit(&mut self, data: &TrainingSet) -> Result<(), ModelError> {
        self.fitted.clear(); // a failed fit leaves no model, not the previous one
        let p = data.validate()?;
        let x = dense(&data.x)?;
        let mut trees = Vec::with_capacity(self.trees);
        for t in 0..self.trees.max(1) as u64 {
            let params = RandomForestRegressorParameters::default()
                .with_n_trees(1)
                .with_min_samples_leaf(self.min_leaf)
                .with_min_samples_split(2)
                .with_m(p.div_ceil(3))
                .with_seed(
                    self.seed
                        .wrapping_add(t.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                );
            let tree = Forest::fit_with_weights(&x, &data.y, &data.w, params).map_err(|e| {
                ModelError::Backend {
                    model: "forest",
                    reason: e.to_string(),
                }
            })?;
            trees.push(tree);
        }
        self.fitted = trees;
        self.width = p;
        Ok(())
    }

    fn predict(&self, x: &[Vec<f64>]) -> Result<Vec<f64>, ModelError> {
        Ok(self
            .predict_spread(x)?
            .into_iter()
            .map(|(m, _)| m)
            .collect())
    }

    fn predict_spread(&self, x: &[Vec<f64>]) -> Result<Vec<(f64, f64)>, ModelError> {
        if self.fitted.is_empty() {
            return Err(ModelError::NotFitted);
        }
        if x.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(row) = x.iter().find(|r| r.len() != self.width) {
            return Err(ModelError::BadData(format!(
                "a row of {} features, the model was fitted on {}",
                row.len(),
                self.width
            )));
        }
        let xm = dense(x)?;
        let mut sum = vec![0.0; x.len()];
        let mut sq = vec![0.0; x.len()];
        for tree in &self.fitted {
            let p = tree.predict(&xm).map_err(|e| ModelError::Backend {
                model: "forest",
                reason: e.to_string(),
            })?;
            for ((s, q), v) in sum.iter_mut().zip(&mut sq).zip(p) {
                *s += v;
                *q += v * v;
            }
        }
        let n = self.fitted.len() as f64;
        Ok(sum
            .into_iter()
            .zip(sq)
            .map(|(s, q)| {
                let mean = s / n;
                (mean, (q / n - mean * mean).max(0.0).sqrt())
            })
            .collect())
    }
}

/// Elastic-net regression (linfa) on z-scored features plus their squares, so that the
/// U-shaped effects of block sizes can be represented. Weights enter exactly: weighted
/// centring, then rows scaled by √w, then a fit without intercept.
pub struct LinearModel {
    /// Overall penalty strength.
    pub penalty: f64,
    /// Share of L1 in the penalty (0 = ridge, 1 = lasso).
    pub l1_ratio: f64,
    fitted: Option<LinearFit>,
}

struct LinearFit {
    mean: Vec<f64>,
    scale: Vec<f64>,
    y_mean: f64,
    coef: Vec<f64>,
}

impl LinearModel {
    /// Penalty 0.01, L1 share 0.5.
    pub fn new() -> Self {
        LinearModel {
            penalty: 0.01,
            l1_ratio: 0.5,
            fitted: None,
        }
    }
}

impl Default for LinearModel {
    fn default() -> Self {
        LinearModel::new()
    }
}

impl LinearFit {
    /// Standardised features and their squares.
    fn expand(&self, row: &[f64]) -> Vec<f64> {
        let z: Vec<f64> = row
            .iter()
            .zip(self.mean.iter().zip(&self.scale))
            .map(|(v, (m, s))| (v - m) / s)
            .collect();
        let sq: Vec<f64> = z.iter().map(|v| v * v).collect();
        z.into_iter().chain(sq).collect()
    }
}

impl CostModel for LinearModel {
    fn name(&self) -> &'static str {
        "linear"
    }

    fn fit(&mut self, data: &TrainingSet) -> Result<(), ModelError> {
        self.fitted = None; // a failed fit leaves no model, not the previous one
        let p = data.validate()?;
        let wsum: f64 = data.w.iter().sum();
        let mut mean = vec![0.0; p];
        for (row, w) in data.x.iter().zip(&data.w) {
            for (m, v) in mean.iter_mut().zip(row) {
                *m += w * v / wsum;
            }
        }
        let mut scale = vec![0.0; p];
        for (row, w) in data.x.iter().zip(&data.w) {
            for ((s, v), m) in scale.iter_mut().zip(row).zip(&mean) {
                *s += w * (v - m) * (v - m) / wsum;
            }
        }
        for s in &mut scale {
            *s = if *s > 1e-12 { s.sqrt() } else { 1.0 };
        }
        let mut fit = LinearFit {
            mean,
            scale,
            y_mean: 0.0,
            coef: Vec::new(),
        };
        let rows: Vec<Vec<f64>> = data.x.iter().map(|r| fit.expand(r)).collect();
        let q = 2 * p;
        // Weighted centring of the expanded columns and of y, then √w row scaling.
        let mut col_mean = vec![0.0; q];
        for (row, w) in rows.iter().zip(&data.w) {
            for (m, v) in col_mean.iter_mut().zip(row) {
                *m += w * v / wsum;
            }
        }
        let y_mean: f64 = data.y.iter().zip(&data.w).map(|(y, w)| w * y).sum::<f64>() / wsum;
        let n = rows.len();
        let mut xa = Array2::<f64>::zeros((n, q));
        let mut ya = Array1::<f64>::zeros(n);
        for (i, (row, (y, w))) in rows.iter().zip(data.y.iter().zip(&data.w)).enumerate() {
            let sw = w.sqrt();
            for (j, (v, m)) in row.iter().zip(&col_mean).enumerate() {
                xa[[i, j]] = sw * (v - m);
            }
            ya[i] = sw * (y - y_mean);
        }
        let model = ElasticNetParams::new()
            .penalty(self.penalty)
            .l1_ratio(self.l1_ratio)
            .with_intercept(false)
            .max_iterations(2000)
            .tolerance(1e-6)
            .fit(&Dataset::new(xa, ya))
            .map_err(|e| ModelError::Backend {
                model: "linear",
                reason: e.to_string(),
            })?;
        let coef: Vec<f64> = model.hyperplane().iter().copied().collect();
        // Fold the column centring into the intercept.
        fit.y_mean = y_mean - coef.iter().zip(&col_mean).map(|(c, m)| c * m).sum::<f64>();
        fit.coef = coef;
        self.fitted = Some(fit);
        Ok(())
    }

    fn predict(&self, x: &[Vec<f64>]) -> Result<Vec<f64>, ModelError> {
        let fit = self.fitted.as_ref().ok_or(ModelError::NotFitted)?;
        x.iter()
            .map(|row| {
                if row.len() != fit.mean.len() {
                    return Err(ModelError::BadData(format!(
                        "row of {} features, model fitted on {}",
                        row.len(),
                        fit.mean.len()
                    )));
                }
                let e = fit.expand(row);
                Ok(fit.y_mean + e.iter().zip(&fit.coef).map(|(v, c)| v * c).sum::<f64>())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::Rng;

    /// y = (x0 - 0.3)² + 0.5·x1 + noise, x ∈ [0, 1)³ (x2 irrelevant).
    fn data(n: usize, seed: u64) -> TrainingSet {
        let mut rng = Rng::new(seed);
        let mut u = || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let mut t = TrainingSet::new();
        for _ in 0..n {
            let x = vec![u(), u(), u()];
            let y = (x[0] - 0.3).powi(2) + 0.5 * x[1] + 0.01 * (u() - 0.5);
            t.push(x, y, 1.0);
        }
        t
    }

    fn check_learns(kind: ModelKind) {
        let train = data(120, 1);
        let test = data(60, 2);
        let mut m = kind.build(7);
        assert_eq!(m.predict(&test.x), Err(ModelError::NotFitted));
        m.fit(&train).unwrap();
        let p = m.predict(&test.x).unwrap();
        let rho = crate::spearman(&p, &test.y);
        assert!(rho > 0.8, "{kind}: spearman {rho}");
    }

    #[test]
    fn forest_learns_a_nonlinear_function() {
        check_learns(ModelKind::Forest);
    }

    #[test]
    fn linear_learns_a_quadratic_function() {
        check_learns(ModelKind::Linear);
    }

    #[test]
    fn models_decline_too_few_points_and_bad_data() {
        for kind in ModelKind::ALL {
            let mut m = kind.build(1);
            let few = data(MIN_POINTS - 1, 3);
            assert_eq!(
                m.fit(&few),
                Err(ModelError::TooFewPoints {
                    have: MIN_POINTS - 1,
                    need: MIN_POINTS
                })
            );
            let mut bad = data(20, 3);
            bad.y[3] = f64::NAN;
            assert!(matches!(m.fit(&bad), Err(ModelError::BadData(_))));
            let mut ragged = data(20, 3);
            ragged.x[0].push(1.0);
            assert!(matches!(m.fit(&ragged), Err(ModelError::BadData(_))));
        }
    }

    #[test]
    fn models_refuse_rows_of_another_width_and_forget_a_fit_that_failed() {
        for kind in ModelKind::ALL {
            let mut m = kind.build(1);
            m.fit(&data(40, 6)).unwrap();
            for width in [2, 4] {
                let rows = vec![vec![0.5; width]];
                assert!(
                    matches!(m.predict(&rows), Err(ModelError::BadData(_))),
                    "{kind}: {width} features"
                );
            }
            let mut bad = data(20, 3);
            bad.y[0] = f64::INFINITY;
            assert!(m.fit(&bad).is_err());
            assert_eq!(
                m.predict(&data(5, 7).x),
                Err(ModelError::NotFitted),
                "{kind}"
            );
        }
    }

    #[test]
    fn forest_is_deterministic_for_a_seed_and_uses_weights() {
        let train = data(80, 4);
        let test = data(20, 5);
        let fit = |seed, t: &TrainingSet| {
            let mut m = ModelKind::Forest.build(seed);
            m.fit(t).unwrap();
            m.predict(&test.x).unwrap()
        };
        assert_eq!(fit(3, &train), fit(3, &train));
        // Zero weight on half the points changes the fit.
        let mut half = train.clone();
        for w in half.w.iter_mut().step_by(2) {
            *w = 0.0;
        }
        assert_ne!(fit(3, &train), fit(3, &half));
    }

    #[test]
    fn forest_spread_is_larger_where_the_data_disagree() {
        // y depends smoothly on x0 for x1 < 0.5 and is pure noise for x1 ≥ 0.5.
        let mut rng = Rng::new(11);
        let mut u = || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let mut t = TrainingSet::new();
        for _ in 0..200 {
            let x = vec![u(), u()];
            let y = if x[1] < 0.5 { x[0] } else { 4.0 * (u() - 0.5) };
            t.push(x, y, 1.0);
        }
        let mut m = ModelKind::Forest.build(2);
        m.fit(&t).unwrap();
        let probe: Vec<Vec<f64>> = (0..20)
            .flat_map(|i| [vec![i as f64 / 20.0, 0.25], vec![i as f64 / 20.0, 0.75]])
            .collect();
        let ps = m.predict_spread(&probe).unwrap();
        assert_eq!(
            ps.iter().map(|p| p.0).collect::<Vec<_>>(),
            m.predict(&probe).unwrap(),
            "the mean is the prediction"
        );
        let mean_spread =
            |noisy: usize| ps.iter().skip(noisy).step_by(2).map(|p| p.1).sum::<f64>() / 20.0;
        assert!(ps.iter().all(|p| p.1 >= 0.0 && p.1.is_finite()));
        assert!(
            mean_spread(1) > 3.0 * mean_spread(0),
            "smooth {} noisy {}",
            mean_spread(0),
            mean_spread(1)
        );
        // A model without an uncertainty estimate reports none.
        let mut lin = ModelKind::Linear.build(2);
        lin.fit(&t).unwrap();
        assert!(lin
            .predict_spread(&probe)
            .unwrap()
            .iter()
            .all(|p| p.1 == 0.0));
    }

    #[test]
    fn kinds_parse() {
        assert_eq!("forest".parse::<ModelKind>(), Ok(ModelKind::Forest));
        let e = "xgb".parse::<ModelKind>().unwrap_err().to_string();
        assert!(e.contains("forest, linear"), "{e}");
    }
}
