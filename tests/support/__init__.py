"""Helpers the test modules share: servers, seeds, worlds and probes. Test modules import from
here and never from one another."""
