//! Search spaces: knobs with listed values, constraint rules, and the configs drawn from them.
//!
//! A [`Space`] is the cartesian product of its knobs, filtered by its rules. Kernels build one
//! per workload (rules may depend on the shape), strategies enumerate or sample it, and
//! [`Space::check`] tells whether a stored config still fits.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::rng::Rng;

/// One knob setting: a whole number (tile sizes, thread counts) or a name (micro-kernel,
/// parallel mode). JSON keeps the natural form: `{"kc":256,"par":"m"}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Value {
    /// A whole number: a tile size, a block size, a thread count (JSON number).
    Int(i64),
    /// A name: a micro-kernel, a parallel mode (JSON string).
    Str(String),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(i) => write!(f, "{i}"),
            Value::Str(s) => f.write_str(s),
        }
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}

impl From<usize> for Value {
    fn from(v: usize) -> Self {
        Value::Int(v as i64)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(v.to_string())
    }
}

/// A point in a space: knob name → value. Ordered, so its JSON and its hash are stable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Config(pub BTreeMap<String, Value>);

impl Config {
    /// A config from `(knob, value)` pairs.
    pub fn from_pairs<I, K, V>(pairs: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<Value>,
    {
        Config(
            pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }

    /// The value of knob `name`, if set.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name)
    }

    /// The threads a config computes with: one for `par: none` (or no `par` knob), else its
    /// `threads` knob (at least one). The one reading of the CPU families' parallel knobs
    /// for the tuner's tie-break, the cost model's features and the runtime's fallback rule.
    pub fn threads(&self) -> usize {
        match self.str("par") {
            None | Some("none") => 1,
            Some(_) => self.int("threads").map_or(1, |t| t.max(1) as usize),
        }
    }

    /// The whole-number value of knob `name`, if set and a number.
    pub fn int(&self, name: &str) -> Option<i64> {
        match self.0.get(name)? {
            Value::Int(i) => Some(*i),
            Value::Str(_) => None,
        }
    }

    /// The name value of knob `name`, if set and a name.
    pub fn str(&self, name: &str) -> Option<&str> {
        match self.0.get(name)? {
            Value::Str(s) => Some(s),
            Value::Int(_) => None,
        }
    }

    /// Sets knob `name`.
    pub fn set(&mut self, name: &str, value: impl Into<Value>) {
        self.0.insert(name.to_string(), value.into());
    }

    /// Compact JSON, the form stored in the database.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a map of strings and integers always serialises")
    }

    /// Parses the JSON form.
    pub fn from_json(s: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(s)
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_json())
    }
}

/// A tunable parameter and the values the search may give it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Knob {
    /// The knob's name, the key of its value in a [`Config`].
    pub name: String,
    /// The values the knob may take, without duplicates, in the order they were listed.
    pub values: Vec<Value>,
}

type Predicate = Box<dyn Fn(&Config) -> bool + Send + Sync>;

/// A named constraint; a config is valid only if every rule holds.
pub(crate) struct Rule {
    /// The rule's name, what [`SpaceError::RuleViolated`] reports.
    pub name: String,
    check: Predicate,
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule").field("name", &self.name).finish()
    }
}

/// Why a config does not fit a space.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpaceError {
    /// The config does not set this knob of the space.
    #[error("knob '{0}' is missing")]
    MissingKnob(String),
    /// The config sets a knob the space does not have.
    #[error("'{0}' is not a knob of this kernel")]
    UnknownKnob(String),
    /// The config gives a knob a value the knob does not list.
    #[error("knob '{knob}' = {value} is not one of its values ({allowed})")]
    ValueNotListed {
        /// The knob's name.
        knob: String,
        /// The value the config gives it.
        value: String,
        /// The knob's listed values, comma-separated.
        allowed: String,
    },
    /// The config sets every knob to a listed value, but this rule of the space does not hold.
    #[error("rule '{0}' does not hold")]
    RuleViolated(String),
}

/// Knobs plus rules. Build with [`Space::new`], [`Space::knob`] and [`Space::rule`].
#[derive(Debug, Default)]
pub struct Space {
    knobs: Vec<Knob>,
    rules: Vec<Rule>,
}

impl Space {
    /// An empty space (one config: the empty one).
    pub fn new() -> Self {
        Space::default()
    }

    /// Adds a knob with its listed values (duplicates removed, order kept).
    pub fn knob<V: Into<Value>>(mut self, name: &str, values: impl IntoIterator<Item = V>) -> Self {
        let mut vals: Vec<Value> = Vec::new();
        for v in values.into_iter().map(Into::into) {
            if !vals.contains(&v) {
                vals.push(v);
            }
        }
        assert!(!vals.is_empty(), "knob '{name}' needs at least one value");
        self.knobs.push(Knob {
            name: name.to_string(),
            values: vals,
        });
        self
    }

    /// Adds a named rule.
    pub fn rule(
        mut self,
        name: &str,
        check: impl Fn(&Config) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.rules.push(Rule {
            name: name.to_string(),
            check: Box::new(check),
        });
        self
    }

    /// A space no config fits, with `reason` as its one rule: what a family answers for a
    /// workload or machine it cannot run on.
    pub fn unsatisfiable(reason: &str) -> Self {
        Space::new().rule(reason, |_| false)
    }

    /// The knobs, in declaration order.
    pub fn knobs(&self) -> &[Knob] {
        &self.knobs
    }

    /// The names of the rules.
    pub fn rule_names(&self) -> Vec<&str> {
        self.rules.iter().map(|r| r.name.as_str()).collect()
    }

    /// Size of the unconstrained product of the knobs.
    pub fn cardinality(&self) -> u128 {
        self.knobs.iter().map(|k| k.values.len() as u128).product()
    }

    /// The `index`-th config of the unconstrained product (mixed radix, last knob fastest).
    pub fn config_at(&self, mut index: u128) -> Config {
        let mut c = Config::default();
        for knob in self.knobs.iter().rev() {
            let n = knob.values.len() as u128;
            c.0.insert(knob.name.clone(), knob.values[(index % n) as usize].clone());
            index /= n;
        }
        c
    }

    /// Whether every rule holds for `c` (knob membership is not checked; see [`Space::check`]).
    pub fn satisfies_rules(&self, c: &Config) -> bool {
        self.rules.iter().all(|r| (r.check)(c))
    }

    /// Full check: every knob present with a listed value, nothing extra, every rule holding.
    pub fn check(&self, c: &Config) -> Result<(), SpaceError> {
        for knob in &self.knobs {
            let v = c
                .get(&knob.name)
                .ok_or_else(|| SpaceError::MissingKnob(knob.name.clone()))?;
            if !knob.values.contains(v) {
                let allowed = knob
                    .values
                    .iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(SpaceError::ValueNotListed {
                    knob: knob.name.clone(),
                    value: v.to_string(),
                    allowed,
                });
            }
        }
        if let Some(extra) =
            c.0.keys()
                .find(|k| !self.knobs.iter().any(|kn| &kn.name == *k))
        {
            return Err(SpaceError::UnknownKnob(extra.clone()));
        }
        match self.rules.iter().find(|r| !(r.check)(c)) {
            Some(r) => Err(SpaceError::RuleViolated(r.name.clone())),
            None => Ok(()),
        }
    }

    /// Every valid config, in index order.
    pub fn iter_valid(&self) -> impl Iterator<Item = Config> + '_ {
        (0..self.cardinality())
            .map(|i| self.config_at(i))
            .filter(|c| self.satisfies_rules(c))
    }

    /// Number of valid configs (enumerates the space).
    pub fn count_valid(&self) -> usize {
        self.iter_valid().count()
    }

    /// A uniformly random valid config, or `None` if the space has none.
    ///
    /// Rejection sampling first; when rules reject almost everything it falls back to
    /// enumerating the valid configs, so sparse spaces are sampled uniformly too.
    pub fn sample(&self, rng: &mut Rng) -> Option<Config> {
        let n = self.cardinality();
        for _ in 0..256 {
            let c = self.config_at(rng.below(n.min(u64::MAX as u128) as u64) as u128);
            if self.satisfies_rules(&c) {
                return Some(c);
            }
        }
        let valid: Vec<Config> = self.iter_valid().collect();
        if valid.is_empty() {
            return None;
        }
        Some(valid[rng.below(valid.len() as u64) as usize].clone())
    }

    /// The listed value of knob `name` nearest to `target` (for snapping analytic defaults
    /// onto the grid). Panics if the knob does not exist or is not numeric (a kernel bug).
    pub fn nearest_int(&self, name: &str, target: i64) -> i64 {
        let knob = self
            .knobs
            .iter()
            .find(|k| k.name == name)
            .expect("knob exists");
        knob.values
            .iter()
            .filter_map(|v| match v {
                Value::Int(i) => Some(*i),
                Value::Str(_) => None,
            })
            .min_by_key(|&v| ((v - target).abs(), v))
            .expect("numeric knob")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_reads_the_parallel_knobs() {
        let c = |pairs: &[(&str, Value)]| Config::from_pairs(pairs.iter().cloned());
        assert_eq!(
            c(&[]).threads(),
            1,
            "no par knob: serial (e.g. GPU configs)"
        );
        let none = c(&[("par", "none".into()), ("threads", 1usize.into())]);
        assert_eq!(none.threads(), 1);
        let n2 = c(&[("par", "n".into()), ("threads", 2usize.into())]);
        assert_eq!(n2.threads(), 2);
        assert_eq!(
            c(&[("par", "heads".into())]).threads(),
            1,
            "no threads knob"
        );
    }

    fn space() -> Space {
        Space::new()
            .knob("mr", [4usize, 6, 8])
            .knob("par", ["none", "m"])
            .knob("threads", [1usize, 2])
            .rule("serial_means_one_thread", |c| {
                (c.str("par") == Some("none")) == (c.int("threads") == Some(1))
            })
    }

    #[test]
    fn enumerates_only_valid_configs() {
        let s = space();
        assert_eq!(s.cardinality(), 12);
        let valid: Vec<_> = s.iter_valid().collect();
        assert_eq!(valid.len(), 6);
        assert!(valid.iter().all(|c| s.check(c).is_ok()));
    }

    #[test]
    fn check_names_the_problem() {
        let s = space();
        let mut c = Config::from_pairs([
            ("mr", Value::from(6usize)),
            ("par", "m".into()),
            ("threads", 2usize.into()),
        ]);
        assert_eq!(s.check(&c), Ok(()));
        c.set("threads", 1usize);
        assert_eq!(
            s.check(&c),
            Err(SpaceError::RuleViolated("serial_means_one_thread".into()))
        );
        c.set("mr", 5usize);
        assert!(matches!(
            s.check(&c),
            Err(SpaceError::ValueNotListed { .. })
        ));
        c.set("mr", 6usize);
        c.set("bogus", 1usize);
        assert_eq!(s.check(&c), Err(SpaceError::UnknownKnob("bogus".into())));
        let mut c2 = Config::from_pairs([("mr", 6usize)]);
        c2.set("par", "none");
        assert_eq!(s.check(&c2), Err(SpaceError::MissingKnob("threads".into())));
    }

    #[test]
    fn sampling_is_seeded_and_valid() {
        let s = space();
        let a: Vec<_> = {
            let mut r = Rng::new(3);
            (0..20).map(|_| s.sample(&mut r).unwrap()).collect()
        };
        let b: Vec<_> = {
            let mut r = Rng::new(3);
            (0..20).map(|_| s.sample(&mut r).unwrap()).collect()
        };
        assert_eq!(a, b);
        assert!(a.iter().all(|c| s.check(c).is_ok()));
        let empty = Space::new().knob("x", [1usize]).rule("never", |_| false);
        assert_eq!(empty.sample(&mut Rng::new(1)), None);
    }

    #[test]
    fn config_json_is_stable_and_natural() {
        let c = Config::from_pairs([("par", Value::from("m")), ("kc", 256usize.into())]);
        assert_eq!(c.to_json(), r#"{"kc":256,"par":"m"}"#);
        assert_eq!(Config::from_json(&c.to_json()).unwrap(), c);
    }

    #[test]
    fn nearest_int_snaps_to_the_grid() {
        let s = Space::new().knob("kc", [64usize, 128, 256, 512]);
        assert_eq!(s.nearest_int("kc", 200), 256);
        assert_eq!(s.nearest_int("kc", 1), 64);
        assert_eq!(s.nearest_int("kc", 100_000), 512);
        assert_eq!(s.nearest_int("kc", 96), 64);
    }
}
