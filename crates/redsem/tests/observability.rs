//! tracing spans and events, and (feature `metrics`) the metrics, as a subscriber and a
//! recorder see them. Both are installed once for this test binary; each test uses its own
//! semaphore name and looks only at what carries it.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One captured event: level, message, own fields, and the spans it happened in
/// (innermost first) with their fields.
#[derive(Clone, Debug)]
struct Captured {
    level: Level,
    message: String,
    fields: BTreeMap<String, String>,
    spans: Vec<(String, BTreeMap<String, String>)>,
}

impl Captured {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
    fn span(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        self.spans.iter().find(|(n, _)| n == name).map(|(_, f)| f)
    }
    /// The semaphore this event is about: its own field, or its spans'.
    fn semaphore(&self) -> Option<&str> {
        self.field("semaphore").or_else(|| {
            self.spans
                .iter()
                .find_map(|(_, f)| f.get("semaphore").map(String::as_str))
        })
    }
}

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Captured>>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        attrs.record(&mut f);
        ctx.span(id).unwrap().extensions_mut().insert(f);
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        let mut ext = span.extensions_mut();
        if let Some(f) = ext.get_mut::<Fields>() {
            values.record(f);
        }
    }
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        if !event.metadata().target().starts_with("redsem")
            && !event.metadata().target().starts_with("observability")
        {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        let message = f.0.remove("message").unwrap_or_default();
        let spans = ctx
            .event_scope(event)
            .map(|scope| {
                scope
                    .map(|s| {
                        let fields = s
                            .extensions()
                            .get::<Fields>()
                            .map(|f| f.0.clone())
                            .unwrap_or_default();
                        (s.name().to_owned(), fields)
                    })
                    .collect()
            })
            .unwrap_or_default();
        self.0.lock().unwrap().push(Captured {
            level: *event.metadata().level(),
            message,
            fields: f.0,
            spans,
        });
    }
}

fn capture() -> &'static Capture {
    static CAPTURE: OnceLock<Capture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let capture = Capture::default();
        let subscriber = tracing_subscriber::registry().with(
            capture
                .clone()
                .with_filter(tracing_subscriber::filter::LevelFilter::DEBUG),
        );
        tracing::subscriber::set_global_default(subscriber).unwrap();
        #[cfg(feature = "metrics")]
        recorder::install();
        capture
    })
}

/// The events about semaphore `name` so far.
fn events(name: &str) -> Vec<Captured> {
    capture()
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.semaphore() == Some(name))
        .cloned()
        .collect()
}

async fn wait_for_event(name: &str, message: &str) -> Captured {
    for _ in 0..500 {
        if let Some(e) = events(name).into_iter().find(|e| e.message == message) {
            return e;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no event {message:?} for {name}: {:#?}", events(name));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_wait_grant_hold_and_release_are_traced() {
    capture();
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let sem = open(&client, "traced", 1, Duration::from_secs(5)).await;
    let first = sem.acquire().await.unwrap();
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move {
            let permit = sem.acquire().await.unwrap();
            let (holder, ticket) = (permit.holder_id().to_owned(), permit.ticket());
            permit
                .run(async { tracing::info!(target: "observability", "working") })
                .await
                .unwrap();
            (holder, ticket)
        })
    };
    let queued = wait_for_event("traced", "waiting in the queue").await;
    assert_eq!(queued.level, Level::DEBUG);
    let acquire_span = queued
        .span("redsem.acquire")
        .expect("inside the acquire span");
    assert_eq!(acquire_span["permits"], "1");
    assert_eq!(acquire_span["mode"], "wait");
    assert!(acquire_span.contains_key("holder"), "{acquire_span:?}");
    first.release().await.unwrap();
    let (holder, ticket) = waiter.await.unwrap();

    let granted = events("traced")
        .into_iter()
        .find(|e| {
            e.message == "granted"
                && e.span("redsem.acquire").unwrap().get("holder") == Some(&holder)
        })
        .expect("a granted event for the waiter");
    let span = granted.span("redsem.acquire").unwrap();
    assert_eq!(span["ticket"], ticket.to_string());
    assert_eq!(span["slots"], "[0]");
    assert!(granted.fields.contains_key("waited_ms"));

    // Work run under a permit carries the permit's identity.
    let working = events("traced")
        .into_iter()
        .find(|e| e.message == "working")
        .unwrap();
    let hold = working.span("redsem.hold").unwrap();
    assert_eq!(hold["holder"], holder);
    assert_eq!(hold["ticket"], ticket.to_string());
    assert_eq!(hold["slots"], "[0]");
    assert_eq!(hold["semaphore"], "traced");

    let released: Vec<_> = events("traced")
        .into_iter()
        .filter(|e| e.message.starts_with("released"))
        .collect();
    assert_eq!(released.len(), 2, "{released:#?}");
    assert!(
        released
            .iter()
            .any(|e| e.field("holder") == Some(holder.as_str()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_are_traced_and_a_lost_lease_is_a_warning() {
    capture();
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let sem = open(&client, "lost-traced", 1, Duration::from_millis(400)).await;
    let permit = sem.acquire().await.unwrap();
    let renewed = wait_for_event("lost-traced", "renewed").await;
    let span = renewed.span("redsem.renew").unwrap();
    assert_eq!(span["holders"], "1");
    assert_eq!(span["waiters"], "0");

    assert!(sem.force_release(permit.holder_id()).await.unwrap());
    let reason = tokio::time::timeout(Duration::from_secs(3), permit.lost())
        .await
        .unwrap();
    assert_eq!(reason, redsem::LostReason::NotHolder);
    let lost = wait_for_event("lost-traced", "lease lost").await;
    assert_eq!(lost.level, Level::WARN);
    assert_eq!(lost.field("holder"), Some(permit.holder_id()));
    assert_eq!(
        lost.field("ticket"),
        Some(permit.ticket().to_string().as_str())
    );
    assert_eq!(lost.field("slots"), Some("[0]"));
    assert!(lost.field("reason").unwrap().contains("gone"), "{lost:?}");
    drop(permit);

    #[cfg(feature = "metrics")]
    {
        assert_eq!(
            recorder::value(
                "redsem_client_leases_lost_total{reason=not_holder,semaphore=lost-traced}"
            ),
            1.0
        );
        assert!(recorder::value("redsem_client_renewals_total{semaphore=lost-traced}") >= 1.0);
    }
}

#[cfg(feature = "metrics")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_grants_waits_holds_failures_and_expiries() {
    use recorder::value;
    capture();
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let sem = open(&client, "measured", 1, Duration::from_millis(300)).await;
    let name = "semaphore=measured";

    let first = sem.acquire().await.unwrap();
    assert_eq!(value(&format!("redsem_client_holders{{{name}}}")), 1.0);
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire().await.unwrap() })
    };
    assert!(
        eventually(Duration::from_secs(5), || value(&format!(
            "redsem_client_waiters{{{name}}}"
        )) == 1.0)
        .await
    );
    // a timed-out acquisition is counted as a failure, and leaves the gauge as it was
    let err = sem
        .acquire_timeout(Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(matches!(err, redsem::Error::Timeout { .. }));
    assert_eq!(
        value(&format!(
            "redsem_client_acquire_failures_total{{reason=timeout,{name}}}"
        )),
        1.0
    );
    assert_eq!(value(&format!("redsem_client_waiters{{{name}}}")), 1.0);

    tokio::time::sleep(Duration::from_millis(100)).await;
    first.release().await.unwrap();
    let second = waiter.await.unwrap();
    assert_eq!(value(&format!("redsem_client_waiters{{{name}}}")), 0.0);
    assert_eq!(value(&format!("redsem_client_grants_total{{{name}}}")), 2.0);
    assert_eq!(
        value(&format!(
            "redsem_client_acquire_wait_seconds{{{name}}}#count"
        )),
        2.0
    );
    assert!(value(&format!("redsem_client_acquire_wait_seconds{{{name}}}#max")) >= 0.1);
    assert_eq!(
        value(&format!("redsem_client_hold_seconds{{{name}}}#count")),
        1.0
    );
    assert!(value(&format!("redsem_client_hold_seconds{{{name}}}#max")) >= 0.1);

    // A holder that stops renewing expires; stats report the server-wide count of reaped leases.
    second.detach();
    assert_eq!(value(&format!("redsem_client_holders{{{name}}}")), 0.0);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let stats = sem.stats().await.unwrap();
    assert!(stats.expired_total >= 1);
    // (a server-wide count is the exporter's `redsem_semaphore_expired_total`: the library
    // records only what its own process did, so that `sum()` over replicas counts once, and
    // every name it records is listed in `redsem::metrics::ALL`, docs/metrics.md's table)
    for recorded in recorder::names() {
        assert!(
            recorded.starts_with("redsem_client_")
                && redsem::metrics::ALL.contains(&recorded.as_str()),
            "{recorded}: every library series is per process (redsem_client_*) and in metrics::ALL"
        );
    }
}

/// `redsem_client_grants_total` and `redsem_client_holders` count acquisitions (one per `Permit`),
/// not permits: an `acquire_many(3)` counts once in each.
#[cfg(feature = "metrics")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_and_local_holders_count_acquisitions_not_permits() {
    use recorder::value;
    capture();
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let sem = open(&client, "counted", 5, Duration::from_secs(5)).await;
    let grants = || value("redsem_client_grants_total{semaphore=counted}");
    let holders = || value("redsem_client_holders{semaphore=counted}");

    let three = sem.acquire_many(3).await.unwrap();
    assert_eq!(three.num_permits(), 3);
    assert_eq!((grants(), holders()), (1.0, 1.0));
    assert_eq!(sem.local_counts(), (1, 0));
    let one = sem.acquire().await.unwrap();
    assert_eq!((grants(), holders()), (2.0, 2.0));

    three.release().await.unwrap();
    assert_eq!((grants(), holders()), (2.0, 1.0));
    drop(one);
    assert_eq!((grants(), holders()), (2.0, 0.0));
    assert_eq!(
        sem.stats().await.unwrap().grants_total,
        2,
        "the server counts the same way"
    );
}

/// A minimal `metrics` recorder: counters and gauges by `name{label=value,...}` (labels
/// sorted), histograms as `...#count`, `...#sum` and `...#max`.
#[cfg(feature = "metrics")]
mod recorder {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};

    use metrics::{
        Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata,
        Recorder, SharedString, Unit,
    };

    type Values = Arc<Mutex<HashMap<String, f64>>>;

    fn values() -> &'static Values {
        static VALUES: OnceLock<Values> = OnceLock::new();
        VALUES.get_or_init(Values::default)
    }

    pub fn value(key: &str) -> f64 {
        values().lock().unwrap().get(key).copied().unwrap_or(0.0)
    }

    /// The metric names recorded so far (without labels).
    pub fn names() -> Vec<String> {
        let values = values().lock().unwrap();
        let mut names: Vec<String> = values
            .keys()
            .map(|k| k.split(['{', '#']).next().unwrap().to_owned())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    struct Handle(String);

    fn update(key: &str, f: impl FnOnce(&mut f64)) {
        f(values()
            .lock()
            .unwrap()
            .entry(key.to_owned())
            .or_insert(0.0));
    }

    impl CounterFn for Handle {
        fn increment(&self, v: u64) {
            update(&self.0, |x| *x += v as f64);
        }
        fn absolute(&self, v: u64) {
            update(&self.0, |x| *x = x.max(v as f64));
        }
    }
    impl GaugeFn for Handle {
        fn increment(&self, v: f64) {
            update(&self.0, |x| *x += v);
        }
        fn decrement(&self, v: f64) {
            update(&self.0, |x| *x -= v);
        }
        fn set(&self, v: f64) {
            update(&self.0, |x| *x = v);
        }
    }
    impl HistogramFn for Handle {
        fn record(&self, v: f64) {
            update(&format!("{}#count", self.0), |x| *x += 1.0);
            update(&format!("{}#sum", self.0), |x| *x += v);
            update(&format!("{}#max", self.0), |x| *x = x.max(v));
        }
    }

    fn name(key: &Key) -> String {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        format!("{}{{{}}}", key.name(), labels.join(","))
    }

    struct Rec;
    impl Recorder for Rec {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(Arc::new(Handle(name(key))))
        }
        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::from_arc(Arc::new(Handle(name(key))))
        }
        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::from_arc(Arc::new(Handle(name(key))))
        }
    }

    pub fn install() {
        metrics::set_global_recorder(Rec).unwrap();
        redsem::metrics::describe();
    }
}
