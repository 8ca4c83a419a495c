//! Server selection and queues. (API contract; implementation pending.)
