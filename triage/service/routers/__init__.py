"""One router per domain: incidents (ingest + read), tickets, scale-up requests, health."""
