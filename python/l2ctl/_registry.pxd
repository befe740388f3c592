# Types for compiling _registry.py with Cython (CMakeLists.txt, L2CTL_COMPILE_REGISTRY). Declarations only:
# the rules stay in _registry.py, the one source, whether it runs interpreted or compiled. What is declared
# here: the two record classes as C structs, and the module's private helpers as C functions with typed
# arguments and locals (their names and signatures as in the .py; tests call none of them).

cimport cython


cdef class Scope:
    cdef public object device
    cdef public tuple slots
    cdef public object window
    cdef public object limit
    cdef public bint share
    cdef public bint reset_on_exit
    cdef public bint fit_hit_ratio
    cdef public bint standing
    cdef public bint orphaned
    cdef public object owner
    cdef public object id
    cdef public object effective
    cdef public object backend
    cdef public bint ending
    cdef public object holder


cdef class DeviceState:
    cdef public object device
    cdef public object maximum
    cdef public dict scopes
    cdef public object base_limit
    cdef public object applied_request
    cdef public object applied_limit
    cdef public dict base_windows
    cdef public dict applied_windows
    cdef public object observed_limit
    cdef public double in_force_demand
    cdef public bint auto_capped
    cdef public object auto_bounds
    cdef public bint dirty
    cdef public Py_ssize_t shared
    cdef public object batch


cdef object _locked()
cdef DeviceState _state(object backend, object device, object maximum)
cdef object _plan(object backend, DeviceState state)
@cython.locals(scope=Scope, top=dict, auto=bint, capped=bint, in_force=list)
cdef object _plan_with(dict generations, DeviceState state)
@cython.locals(scope=Scope, seen=dict)
cdef list _distinct(object scopes)
cdef tuple _auto_bounds(DeviceState state)
@cython.locals(top=dict, applied=dict, changes=dict, scope=Scope, demand=double)
cdef _sync(object backend, DeviceState state, bint reset=*, bint removed=*)
@cython.locals(bases=dict, slots=list, fresh=bint, mixed=bint, handles=list, journal=list)
cdef _apply(object backend, DeviceState state, dict changes, object limit, bint at_least, bint reset)
@cython.locals(bases=dict)
cdef _record_batch(DeviceState state)
cdef _resync(object backend, DeviceState state, list slots)
cdef _forget_idle(dict generations, DeviceState state)
@cython.locals(ending=list, scope=Scope, other=Scope, s=Scope, was_dirty=bint, reset=bint)
cdef _settle(object backend, DeviceState state, bint quiet=*)
@cython.locals(scopes=dict)
cdef _register(DeviceState state, Scope scope, object holder)
@cython.locals(scopes=dict)
cdef _unregister(DeviceState state, Scope scope)
cdef DeviceState _lookup(object backend, object device)
@cython.locals(state=DeviceState, s=Scope, old=Scope)
cdef tuple _enter(object backend, Scope scope, object maximum, object holder)
cdef _learn_base_limit(object backend, DeviceState state)
