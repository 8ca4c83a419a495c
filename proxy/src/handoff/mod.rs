//! Forwarding of established flows behind one seam. (API contract; implementation pending.)
