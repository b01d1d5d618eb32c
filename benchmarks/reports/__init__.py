"""Reports: tables and plots written from the results files."""
