"""Tests of the lockmgr package."""
