"""Tickets: grouping incidents by fingerprint, the ticket lifecycle, and the sinks that mirror them."""
