"""Local stand-ins for cloud services that tests run against."""
