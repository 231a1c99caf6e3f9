//! The planner: placement intent + model inventory + devices -> a plan (not built yet).
