//! Scraping `/metrics` and the health endpoints of a pipeline run with
//! `--metrics-listen`.

use std::time::Duration;

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// `GET url`: status and body (`None` while nothing listens).
pub fn get(url: &str) -> Option<(u16, String)> {
    let mut response = agent().get(url).call().ok()?;
    let status = response.status().as_u16();
    Some((status, response.body_mut().read_to_string().expect("a text body")))
}

/// A parsed scrape of `/metrics`.
pub struct Scrape {
    pub text: String,
    pub parsed: prometheus_parse::Scrape,
}

impl Scrape {
    pub fn take(base: &str) -> Scrape {
        Scrape::try_take(base).expect("the metrics endpoint answers")
    }

    /// A scrape, or `None` while the endpoint does not answer (a run that
    /// is starting).
    pub fn try_take(base: &str) -> Option<Scrape> {
        let (status, text) = get(&format!("{base}/metrics"))?;
        assert_eq!(status, 200, "{text}");
        let parsed = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .unwrap_or_else(|e| panic!("not the Prometheus text format ({e}):\n{text}"));
        Some(Scrape { text, parsed })
    }

    /// The sum of `metric` over its series whose labels include `labels`.
    pub fn sum(&self, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let values: Vec<f64> = self
            .parsed
            .samples
            .iter()
            .filter(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                ref other => panic!("{metric} is not a number: {other:?}"),
            })
            .collect();
        (!values.is_empty()).then(|| values.iter().sum())
    }

    pub fn value(&self, metric: &str) -> f64 {
        self.sum(metric, &[])
            .unwrap_or_else(|| panic!("{metric} missing from the scrape:\n{}", self.text))
    }

    /// Every series of `metric` carries `pipeline`.
    pub fn series(&self, metric: &str) -> Vec<&prometheus_parse::Sample> {
        self.parsed.samples.iter().filter(|s| s.metric == metric).collect()
    }
}
