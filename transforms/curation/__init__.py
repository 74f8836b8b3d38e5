"""Curation shared by both branches: mixing, validation splits, decontamination."""
