-- plunder schema version 16: the trace context a job was enqueued under (W3C trace
-- context as JSON), written only where the producer traced with OpenTelemetry, so that the
-- worker's spans of the job continue the producer's trace (plunder.tracing).
CREATE TABLE plunder_traces (
    job_id BIGINT PRIMARY KEY REFERENCES plunder_jobs (id) ON DELETE CASCADE,
    context TEXT NOT NULL
);
