//! ipsan-scsi
