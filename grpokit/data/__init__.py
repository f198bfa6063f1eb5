"""Datasets: prompt rows from files, folders and the hub; SFT rows; prompt templates."""
