//! OpenTelemetry export (feature `otel`): with the standard variable
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! set, every logical host this command starts exports a span per
//! exchange (see the `vkernel` crate's `otel` module) by OTLP over HTTP
//! (protobuf) in batches, and flushes them as the command ends. The
//! other `OTEL_*` variables (service name, resource attributes, batch
//! sizes and delays, headers) apply as the SDK reads them.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry_sdk::trace::SdkTracerProvider;

static ON: AtomicBool = AtomicBool::new(false);

/// True once an exporter is installed: hosts then make spans.
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Flushes and stops the exporter when dropped.
pub struct Guard(SdkTracerProvider);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Err(e) = self.0.shutdown() {
            eprintln!("vkernel: OpenTelemetry export: {e}");
        }
    }
}

fn set(var: &str) -> bool {
    std::env::var_os(var).is_some_and(|v| !v.is_empty())
}

/// Installs the OTLP exporter if an endpoint is configured.
pub fn init() -> Option<Guard> {
    if !set("OTEL_EXPORTER_OTLP_ENDPOINT") && !set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        return None;
    }
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!("vkernel: OpenTelemetry export disabled: {e}");
            return None;
        }
    };
    let mut resource = opentelemetry_sdk::Resource::builder();
    if !set("OTEL_SERVICE_NAME") {
        resource = resource.with_service_name("vkernel");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    ON.store(true, Ordering::Relaxed);
    Some(Guard(provider))
}
