"""decoder"""
