"""Signed webhooks of run and compaction events: endpoints a tenant registers, an outbox
written in the transaction of the state each event reports, and a sender in every
replica that signs (Standard Webhooks) and delivers with retries."""
