"""Infrastructure under the domain: the beat's lock, the API's liveness record, claim wake-ups and
stored JSON spliced into answers. Nothing here knows about runs, experiments or suites; the
services (server/services/) and the worker build on it."""
